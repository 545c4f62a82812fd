//! The `[[counter]]` rule-file section and its validation.
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

use crate::rules::spec::{check_ident, default_coalesce, default_slot_column, Mode, TableName};

/// `[[counter]]`: hot counters spread over slot rows.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
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
    /// Draining, the first step of taking the rule out (`heatsink migrate
    /// --revert`): increments go to the logical table as written, reads still add
    /// the slot rows, absolute sets and deletes still clear them, so that the slot
    /// rows can be folded while proxies run the rule, with every statement exact.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> Result<Vec<CounterSpec>, toml::de::Error> {
        crate::kinds::entries(
            &format!(
                "[[counter]]\nname = \"h\"\ntable = \"hits\"\nkey = [\"slug\"]\ncolumns = [\"cnt\"]\nslots = 16\nslot_table = \"hits_slots\"\n{extra}"
            ),
            "counter",
        )
    }

    #[test]
    fn parses_with_defaults() {
        let f = spec("").unwrap();
        let c = &f[0];
        assert_eq!(c.slot_column, "slot");
        assert!(c.coalesce);
        assert_eq!(c.mode, Mode::On);
        c.validate().unwrap();
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = spec("slotz = 3\n").unwrap_err();
        assert!(e.message().contains("slotz"), "{e}");
        // The position is the key's in the whole file (line 8), not in the entry.
        assert!(e.to_string().contains("line 8"), "{e}");
    }

    #[test]
    fn impossible_values_are_rejected() {
        for (extra, want) in [
            ("", ""),
            ("slot_column = \"slug\"\n", "twice"),
            ("mode = \"shadow\"\n", ""),
        ] {
            let r = spec(extra).unwrap()[0].validate();
            if want.is_empty() {
                assert!(r.is_ok(), "{extra}: {r:?}");
            } else {
                assert!(r.unwrap_err().contains(want), "{extra}");
            }
        }
        let mut c = spec("").unwrap().remove(0);
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
}
