//! The `[[ring]]` rule-file section and its validation.
//!
//! ```toml
//! [[ring]]
//! name = "recent_visitors"
//! table = "profile_visits"
//! key = ["profile_id"]
//! size = 100
//! ring_table = "profile_visits_ring"
//! order_by = "visited_at"
//! ```

use serde::Deserialize;

use crate::rules::spec::{check_ident, default_coalesce, default_slot_column, Mode, TableName};

/// `[[ring]]`: "keep the last N rows per key" logs as fixed-size rings.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
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

    #[test]
    fn ring_specs() {
        let f: Vec<RingSpec> = crate::kinds::entries(
            "[[ring]]\nname = \"v\"\ntable = \"log\"\nkey = [\"uid\"]\nsize = 5\nring_table = \"log_ring\"\norder_by = \"ts\"\n",
            "ring",
        )
        .unwrap();
        let r = &f[0];
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
}
