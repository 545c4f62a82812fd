//! The rule-file format: one struct per rule kind, deserialised with unknown keys
//! rejected, then validated (impossible values, name clashes).
//!
//! ```toml
//! [[counter]]
//! name = "page_hits"
//! table = "hits"
//! key = ["slug"]
//! columns = ["cnt"]
//! slots = 16
//! slot_table = "hits_slots"
//! ```

use serde::Deserialize;

/// Everything one rule file may contain.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    /// `[[counter]]` sections.
    #[serde(default)]
    pub counter: Vec<CounterSpec>,
    /// `[[ring]]` sections.
    #[serde(default)]
    pub ring: Vec<RingSpec>,
    /// `[[test]]` sections: statements `heatsink check` runs through the rules.
    #[serde(default)]
    pub test: Vec<crate::check::TestCase>,
}

/// A table name as written in a rule: `table` or `db.table`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    /// Database, when the rule names one; otherwise the rule applies in any database.
    pub db: Option<String>,
    /// Table name.
    pub name: String,
}

impl TableName {
    /// Parses `table` or `db.table` (identifiers only: letters, digits, `_`, `$`).
    pub fn parse(s: &str) -> Result<TableName, String> {
        let parts: Vec<&str> = s.split('.').collect();
        let (db, name) = match parts.as_slice() {
            [name] => (None, *name),
            [db, name] => (Some(*db), *name),
            _ => {
                return Err(format!(
                    "`{s}` is not a table name (expected `table` or `db.table`)"
                ))
            }
        };
        for p in db.iter().chain(std::iter::once(&name)) {
            check_ident(p)?;
        }
        Ok(TableName {
            db: db.map(str::to_string),
            name: name.to_string(),
        })
    }

    /// Backquoted SQL form: `` `db`.`t` `` or `` `t` ``.
    pub fn quoted(&self) -> String {
        match &self.db {
            Some(db) => format!("{}.{}", quote(db), quote(&self.name)),
            None => quote(&self.name),
        }
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.db {
            Some(db) => write!(f, "{db}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Backquotes an identifier.
pub fn quote(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

/// Accepts the identifiers rules may use: non-empty, at most 64 characters, letters,
/// digits, `_` and `$`.
pub fn check_ident(s: &str) -> Result<(), String> {
    if s.is_empty()
        || s.len() > 64
        || !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    {
        return Err(format!(
            "`{s}` is not a valid identifier (letters, digits, `_` and `$`, at most 64 characters)"
        ));
    }
    Ok(())
}

/// Whether a rule rewrites or only reports what it would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Rewrite and reject as the rule says.
    #[default]
    On,
    /// Pass statements through unchanged; count and log what would have happened.
    Shadow,
}

/// `[[counter]]`: hot counters spread over slot rows.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CounterSpec {
    /// Unique rule name (metrics, logs, errors).
    pub name: String,
    /// The logical table the application uses (`table` or `db.table`).
    pub table: String,
    /// Columns identifying one counter; empty for a single global counter row.
    #[serde(default)]
    pub key: Vec<String>,
    /// Counter columns.
    pub columns: Vec<String>,
    /// Slot rows per counter.
    pub slots: u32,
    /// Physical table holding the slot rows.
    pub slot_table: String,
    /// Slot number column in `slot_table`.
    #[serde(default = "default_slot_column")]
    pub slot_column: String,
    /// Merge concurrent autocommit increments of one counter into one write
    /// (default on: it is what makes the rule pay off under contention).
    #[serde(default = "default_coalesce")]
    pub coalesce: bool,
    /// `on` (default) or `shadow`.
    #[serde(default)]
    pub mode: Mode,
}

fn default_slot_column() -> String {
    "slot".to_string()
}

/// Largest `slots` accepted: more slots than this only makes reads slower.
pub const MAX_SLOTS: u32 = 1024;

impl CounterSpec {
    /// Checks the values that do not need the database; returns the reason on failure.
    pub fn validate(&self) -> Result<(), String> {
        check_ident(&self.name).map_err(|e| format!("name: {e}"))?;
        let table = TableName::parse(&self.table).map_err(|e| format!("table: {e}"))?;
        let slot_table =
            TableName::parse(&self.slot_table).map_err(|e| format!("slot_table: {e}"))?;
        if table.name.eq_ignore_ascii_case(&slot_table.name) && table.db == slot_table.db {
            return Err("slot_table must differ from table".into());
        }
        if self.slots == 0 || self.slots > MAX_SLOTS {
            return Err(format!(
                "slots must be between 1 and {MAX_SLOTS}, not {}",
                self.slots
            ));
        }
        if self.columns.is_empty() {
            return Err("columns must name at least one counter column".into());
        }
        check_ident(&self.slot_column).map_err(|e| format!("slot_column: {e}"))?;
        let mut seen: Vec<String> = Vec::new();
        for c in self
            .key
            .iter()
            .chain(&self.columns)
            .chain(std::iter::once(&self.slot_column))
        {
            check_ident(c)?;
            let lc = c.to_ascii_lowercase();
            if seen.contains(&lc) {
                return Err(format!(
                    "column `{c}` appears twice among key, columns and slot_column"
                ));
            }
            seen.push(lc);
        }
        Ok(())
    }
}

/// `[[ring]]`: "keep the last N rows per key" logs as fixed-size rings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RingSpec {
    /// Unique rule name (metrics, logs, errors).
    pub name: String,
    /// The logical (log) table the application uses (`table` or `db.table`).
    pub table: String,
    /// Columns identifying one ring; empty for a single ring.
    #[serde(default)]
    pub key: Vec<String>,
    /// Rows kept per key.
    pub size: u32,
    /// Physical table: the logical columns plus slot and sequence columns,
    /// `PRIMARY KEY (key…, slot)`.
    pub ring_table: String,
    /// Physical table holding each key's last sequence number; default
    /// `<ring_table>_seq`.
    #[serde(default)]
    pub seq_table: Option<String>,
    /// The column the application orders by to find the latest rows; used to pick
    /// the rows kept when `heatsink migrate` backfills a ring from the existing log.
    #[serde(default)]
    pub order_by: Option<String>,
    /// Slot number column in `ring_table`.
    #[serde(default = "default_slot_column")]
    pub slot_column: String,
    /// Sequence number column in `ring_table` and `seq_table`.
    #[serde(default = "default_seq_column")]
    pub seq_column: String,
    /// `on` (default) or `shadow`.
    #[serde(default)]
    pub mode: Mode,
    /// Group commit: concurrent autocommit inserts into the ring are merged into
    /// one multi-row write; each client is answered after that write committed
    /// (default on).
    #[serde(default = "default_coalesce")]
    pub coalesce: bool,
}

fn default_coalesce() -> bool {
    true
}

fn default_seq_column() -> String {
    "seq".to_string()
}

/// Largest ring accepted.
pub const MAX_RING: u32 = 100_000;

impl RingSpec {
    /// The sequence table's name.
    pub fn seq_table_name(&self) -> String {
        self.seq_table
            .clone()
            .unwrap_or_else(|| format!("{}_seq", self.ring_table))
    }

    /// Checks the values that do not need the database; returns the reason on failure.
    pub fn validate(&self) -> Result<(), String> {
        check_ident(&self.name).map_err(|e| format!("name: {e}"))?;
        let table = TableName::parse(&self.table).map_err(|e| format!("table: {e}"))?;
        let ring = TableName::parse(&self.ring_table).map_err(|e| format!("ring_table: {e}"))?;
        let seq =
            TableName::parse(&self.seq_table_name()).map_err(|e| format!("seq_table: {e}"))?;
        for (what, t) in [("ring_table", &ring), ("seq_table", &seq)] {
            if t.name.eq_ignore_ascii_case(&table.name) && t.db == table.db {
                return Err(format!("{what} must differ from table"));
            }
        }
        if ring.name.eq_ignore_ascii_case(&seq.name) && ring.db == seq.db {
            return Err("seq_table must differ from ring_table".into());
        }
        if self.size == 0 || self.size > MAX_RING {
            return Err(format!(
                "size must be between 1 and {MAX_RING}, not {}",
                self.size
            ));
        }
        let mut seen: Vec<String> = Vec::new();
        for c in self
            .key
            .iter()
            .chain([&self.slot_column, &self.seq_column])
            .chain(self.order_by.iter())
        {
            check_ident(c)?;
        }
        for c in self.key.iter().chain([&self.slot_column, &self.seq_column]) {
            let lc = c.to_ascii_lowercase();
            if seen.contains(&lc) {
                return Err(format!(
                    "column `{c}` appears twice among key, slot_column and seq_column"
                ));
            }
            seen.push(lc);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> Result<RuleFile, toml::de::Error> {
        toml::from_str(&format!(
            "[[counter]]\nname = \"h\"\ntable = \"hits\"\nkey = [\"slug\"]\ncolumns = [\"cnt\"]\nslots = 16\nslot_table = \"hits_slots\"\n{extra}"
        ))
    }

    #[test]
    fn parses_with_defaults() {
        let f = spec("").unwrap();
        let c = &f.counter[0];
        assert_eq!(c.slot_column, "slot");
        assert!(c.coalesce);
        assert_eq!(c.mode, Mode::On);
        c.validate().unwrap();
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = spec("slotz = 3\n").unwrap_err();
        assert!(e.to_string().contains("slotz"), "{e}");
    }

    #[test]
    fn impossible_values_are_rejected() {
        for (extra, want) in [
            ("", ""),
            ("slot_column = \"slug\"\n", "twice"),
            ("mode = \"shadow\"\n", ""),
        ] {
            let r = spec(extra).unwrap().counter[0].validate();
            if want.is_empty() {
                assert!(r.is_ok(), "{extra}: {r:?}");
            } else {
                assert!(r.unwrap_err().contains(want), "{extra}");
            }
        }
        let mut c = spec("").unwrap().counter.remove(0);
        c.slots = 0;
        assert!(c.validate().unwrap_err().contains("slots"));
        c.slots = 4;
        c.slot_table = "hits".into();
        assert!(c.validate().is_err());
        c.slot_table = "a.b.c".into();
        assert!(c.validate().is_err());
        c.slot_table = "x; DROP".into();
        assert!(c.validate().is_err());
    }

    #[test]
    fn ring_specs() {
        let f: RuleFile = toml::from_str(
            "[[ring]]\nname = \"v\"\ntable = \"log\"\nkey = [\"uid\"]\nsize = 5\nring_table = \"log_ring\"\norder_by = \"ts\"\n",
        )
        .unwrap();
        let r = &f.ring[0];
        r.validate().unwrap();
        assert_eq!(r.seq_table_name(), "log_ring_seq");
        assert_eq!(r.seq_column, "seq");
        let mut bad = r.clone();
        bad.size = 0;
        assert!(bad.validate().unwrap_err().contains("size"));
        let mut bad = r.clone();
        bad.seq_table = Some("log_ring".into());
        assert!(bad.validate().is_err());
        let mut bad = r.clone();
        bad.key = vec!["slot".into()];
        assert!(bad.validate().unwrap_err().contains("twice"));
    }

    #[test]
    fn table_names() {
        let t = TableName::parse("shop.hits").unwrap();
        assert_eq!(t.db.as_deref(), Some("shop"));
        assert_eq!(t.quoted(), "`shop`.`hits`");
        assert!(TableName::parse("").is_err());
    }
}
