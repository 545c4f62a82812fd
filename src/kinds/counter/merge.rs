//! Group commit of counter increments (`coalesce = true` on a `[[counter]]`):
//! concurrent increments of the same counter become one slot upsert of the summed
//! deltas; every member gets "1 row affected". A failed merged write of several
//! members is not answered: each member runs its own increment alone, so only a
//! statement that fails alone gets an error.

use std::sync::Arc;

use crate::rewrite::merge::{
    Limits, Member, MergeMetric, MergeTable, Merged, Merger, Part, Written,
};
use crate::wire::packets::OkSummary;

/// Counter increments written as part of a merged write.
pub static METRIC: MergeMetric = MergeMetric {
    name: "heatsink_coalesced_increments_total",
    help: "Counter increments written as part of a merged write.",
};

/// The pieces of a mergeable counter increment, by name: the merged upsert is
/// `prefix + keys + ", " + slot + ", " + Σdeltas… + suffix` (no key:
/// `prefix + slot …`). [`crate::rewrite::Plan::aux`] holds them in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncrementPieces<'a, T> {
    /// `INSERT INTO slots (keys…, slot, counters…) VALUES (`.
    pub prefix: &'a T,
    /// The key values, comma-separated (empty for a global counter).
    pub keys: &'a T,
    /// `) ON DUPLICATE KEY UPDATE c = c + VALUES(c), …`.
    pub suffix: &'a T,
    /// The slot number.
    pub slot: &'a T,
    /// One delta per counter column, in the column list's order.
    pub deltas: &'a [T],
}

impl<'a, T> IncrementPieces<'a, T> {
    /// Reads the pieces from `aux` (rendered or not); `None` for another layout.
    pub fn of(aux: &'a [T]) -> Option<Self> {
        match aux {
            [prefix, keys, suffix, slot, deltas @ ..] if !deltas.is_empty() => Some(Self {
                prefix,
                keys,
                suffix,
                slot,
                deltas,
            }),
            _ => None,
        }
    }
}

impl<T: Clone> IncrementPieces<'_, T> {
    /// The pieces as [`crate::rewrite::Plan::aux`] holds them.
    pub fn to_aux(&self) -> Vec<T> {
        let mut aux = vec![
            self.prefix.clone(),
            self.keys.clone(),
            self.suffix.clone(),
            self.slot.clone(),
        ];
        aux.extend_from_slice(self.deltas);
        aux
    }
}

impl IncrementPieces<'_, Vec<u8>> {
    /// The upsert with these deltas (rendered texts, or summed numbers).
    fn upsert<D: AsRef<[u8]>>(&self, deltas: impl Iterator<Item = D>) -> Vec<u8> {
        let mut sql = Vec::with_capacity(256);
        sql.extend_from_slice(self.prefix);
        if !self.keys.is_empty() {
            sql.extend_from_slice(self.keys);
            sql.extend_from_slice(b", ");
        }
        sql.extend_from_slice(self.slot);
        for d in deltas {
            sql.extend_from_slice(b", ");
            sql.extend_from_slice(d.as_ref());
        }
        sql.extend_from_slice(self.suffix);
        sql
    }
}

/// The counter's [`Merger`]: executions of the same counter's increment with the
/// same key merge; parts are the deltas, summed.
#[derive(Debug, Clone, Default)]
pub struct Increments {
    /// The slot table the upserts write ([`Merger::table`]).
    table: Option<MergeTable>,
}

impl Increments {
    /// The merger, as a plan carries it.
    pub fn merger(table: Option<MergeTable>) -> Arc<dyn Merger> {
        Arc::new(Increments { table })
    }
}

impl Merger for Increments {
    fn table(&self) -> Option<&MergeTable> {
        self.table.as_ref()
    }

    fn name(&self) -> &'static str {
        "counter increment"
    }

    fn explain(&self) -> Option<&'static str> {
        Some("concurrent autocommit increments of the same counter may be merged into one write (coalesce)")
    }

    fn metric(&self) -> &'static MergeMetric {
        &METRIC
    }

    fn limits(&self) -> Limits {
        Limits::NONE
    }

    fn part<'a>(&self, aux: &'a [Vec<u8>]) -> Option<(Vec<&'a [u8]>, Part)> {
        let p = IncrementPieces::of(aux)?;
        let deltas: Option<Vec<i64>> = p.deltas.iter().map(|d| parse_delta(d)).collect();
        let part = Part {
            sums: deltas?,
            items: 1,
            ..Part::default()
        };
        Some((vec![p.prefix.as_slice(), p.keys.as_slice()], part))
    }

    fn statement(&self, aux: &[Vec<u8>]) -> Option<Vec<u8>> {
        let p = IncrementPieces::of(aux)?;
        Some(p.upsert(p.deltas.iter()))
    }

    fn merged(&self, aux: &[Vec<u8>], parts: &[Part], sums: &[i64]) -> Option<Merged> {
        let p = IncrementPieces::of(aux)?;
        Some(Merged {
            sql: p.upsert(sums.iter().map(i64::to_string)),
            order: (0..parts.len()).collect(),
        })
    }

    fn returning<'a>(&self, _aux: &'a [Vec<u8>]) -> Option<&'a [u8]> {
        None
    }

    fn returning_alone<'a>(&self, _aux: &'a [Vec<u8>]) -> Option<&'a [u8]> {
        None
    }

    fn alone_after_failure(&self, members: usize) -> bool {
        // The error may be one member's doing (a sum out of range, say). A lone
        // member's write is its own increment: it gets the error (or, when the
        // error says nothing about its UPDATE, runs it as sent: `relay::merge`).
        members > 1
    }

    fn routes_warnings(&self) -> bool {
        false
    }

    fn answer_alone(&self, written: Option<&Written>) -> Result<OkSummary, &'static str> {
        // Never asked: an increment runs alone as rendered.
        self.answer(written, Member { first: 0, items: 1 })
    }

    fn answer(
        &self,
        written: Option<&Written>,
        _member: Member,
    ) -> Result<OkSummary, &'static str> {
        Ok(OkSummary {
            affected_rows: 1,
            last_insert_id: 0,
            status: 0,
            warnings: written.map_or(0, |w| w.warnings),
        })
    }
}

/// Parses a rendered delta (`5`, `-3`, `-(5)`, `+2`, `(7)`) as an integer.
pub fn parse_delta(text: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(text).ok()?.trim();
    let mut negative = false;
    let mut rest = s;
    loop {
        rest = rest.trim();
        if let Some(r) = rest.strip_prefix('-') {
            negative = !negative;
            rest = r;
        } else if let Some(r) = rest.strip_prefix('+') {
            rest = r;
        } else if let Some(r) = rest
            .strip_prefix('(')
            .and_then(|r| r.trim_end().strip_suffix(')'))
        {
            rest = r;
        } else {
            break;
        }
    }
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i64 = rest.parse().ok()?;
    Some(if negative { v.checked_neg()? } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas() {
        assert_eq!(parse_delta(b"5"), Some(5));
        assert_eq!(parse_delta(b"-(5)"), Some(-5));
        assert_eq!(parse_delta(b"-(-5)"), Some(5));
        assert_eq!(parse_delta(b" ( 7 ) "), Some(7));
        assert_eq!(parse_delta(b"'5'"), None);
        assert_eq!(parse_delta(b"1.5"), None);
        assert_eq!(parse_delta(b"0x10"), None);
        assert_eq!(parse_delta(b""), None);
        assert_eq!(parse_delta(b"99999999999999999999"), None);
    }

    fn aux(keys: &str, deltas: &[&str]) -> Vec<Vec<u8>> {
        let mut a: Vec<Vec<u8>> = vec![
            b"INSERT INTO s (k, slot, c, d) VALUES (".to_vec(),
            keys.as_bytes().to_vec(),
            b") ON DUPLICATE KEY UPDATE c = c + VALUES(c)".to_vec(),
            b"3".to_vec(),
        ];
        a.extend(deltas.iter().map(|d| d.as_bytes().to_vec()));
        a
    }

    #[test]
    fn merged_upsert_of_summed_deltas() {
        let m = Increments::default();
        let a = aux("7", &["-(2)", "5"]);
        let (target, part) = m.part(&a).unwrap();
        assert_eq!(target, vec![&a[0][..], b"7"]);
        assert_eq!((part.sums.clone(), part.items), (vec![-2, 5], 1));
        let merged = m.merged(&a, &[part.clone(), part], &[-4, 10]).unwrap();
        assert_eq!(
            String::from_utf8(merged.sql).unwrap(),
            "INSERT INTO s (k, slot, c, d) VALUES (7, 3, -4, 10) ON DUPLICATE KEY UPDATE c = c + VALUES(c)"
        );
        assert_eq!(merged.order, vec![0, 1]);
        let global = aux("", &["1"]);
        assert_eq!(
            m.statement(&global).unwrap(),
            b"INSERT INTO s (k, slot, c, d) VALUES (3, 1) ON DUPLICATE KEY UPDATE c = c + VALUES(c)"
        );
        assert!(m.part(&aux("7", &["'x'"])).is_none());
    }
}
