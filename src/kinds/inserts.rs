//! Group commit of plain multi-row inserts, shared by the kinds whose inserts merge
//! (the ring's upserts into its ring table, the rollup's inserts into its log):
//! concurrent inserts into the same table become one multi-row statement, the parts
//! ordered by their key so that every writer takes locks in the same order. Each
//! member is answered with its own rows; with an AUTO_INCREMENT column the merged
//! write returns every row's id (`RETURNING`, MariaDB ≥ 10.5) and each member's last
//! insert id is its first row's. A failed merged write wrote nothing: every member
//! runs its own insert alone.

use std::sync::Arc;

use sqlparser::ast::{Expr, FunctionArg, FunctionArgExpr, FunctionArguments};

use crate::rewrite::merge::{
    Limits, Member, MergeMetric, MergeTable, Merged, Merger, Part, Written,
};
use crate::rewrite::shape::is_value;
use crate::wire::packets::OkSummary;

/// Rows of inserts merged into one statement at most (the statement must stay well
/// below max_allowed_packet, and one write should not hold many locks).
pub const MAX_ROWS: u64 = 512;
/// Bytes of VALUES text merged into one statement at most (a part that alone is
/// larger is written on its own): far below any max_allowed_packet a server is
/// likely to run with, which would otherwise drop the connection.
pub const MAX_VALUES_BYTES: usize = 64 * 1024;

/// What differs between the kinds that merge inserts.
#[derive(Debug)]
pub struct Flavor {
    /// [`Merger::name`] of merging executions.
    pub name: &'static str,
    /// [`Merger::name`] of executions that only carry pieces to run alone.
    pub name_alone: &'static str,
    /// [`Merger::explain`].
    pub explain: &'static str,
    /// The counter of merged rows.
    pub metric: &'static MergeMetric,
    /// A multi-row insert running alone runs with `RETURNING` to report its first
    /// row's id (an upsert's OK packet reports another row's).
    pub returning_alone: bool,
    /// [`Merger::lanes`].
    pub lanes: u32,
}

/// The pieces of an insert, by name: merged inserts become
/// `prefix + tuples, tuples… (ordered by `order`) + suffix`.
/// [`crate::rewrite::Plan::aux`] holds them in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertPieces<'a, T> {
    /// `INSERT INTO table (columns…) VALUES `.
    pub prefix: &'a T,
    /// This insert's VALUES tuples.
    pub tuples: &'a T,
    /// What follows the tuples (a ring's ` ON DUPLICATE KEY UPDATE …`), or nothing.
    pub suffix: &'a T,
    /// The key values of the first row: merged parts are ordered by them.
    pub order: &'a T,
    /// How many rows the insert has (decimal text).
    pub rows: &'a T,
    /// The table's AUTO_INCREMENT column, quoted, or empty.
    pub ai_column: &'a T,
}

impl<'a, T> InsertPieces<'a, T> {
    /// Reads the pieces from `aux` (rendered or not); `None` for another layout.
    pub fn of(aux: &'a [T]) -> Option<Self> {
        match aux {
            [prefix, tuples, suffix, order, rows, ai_column] => Some(Self {
                prefix,
                tuples,
                suffix,
                order,
                rows,
                ai_column,
            }),
            _ => None,
        }
    }
}

impl<T: Clone> InsertPieces<'_, T> {
    /// The pieces as [`crate::rewrite::Plan::aux`] holds them.
    pub fn to_aux(&self) -> Vec<T> {
        [
            self.prefix,
            self.tuples,
            self.suffix,
            self.order,
            self.rows,
            self.ai_column,
        ]
        .into_iter()
        .cloned()
        .collect()
    }
}

impl<'a> InsertPieces<'a, Vec<u8>> {
    /// The number of rows.
    fn row_count(&self) -> Option<u64> {
        std::str::from_utf8(self.rows).ok()?.parse().ok()
    }

    /// The AUTO_INCREMENT column, if the log has one.
    fn ai(&self) -> Option<&'a [u8]> {
        (!self.ai_column.is_empty()).then_some(self.ai_column.as_slice())
    }
}

/// The [`Merger`] of inserts: inserts into the same table merge (when `merges`;
/// else the pieces only serve an insert running alone with `RETURNING`).
#[derive(Debug, Clone)]
pub struct Inserts {
    /// Executions merge (the rule coalesces and the rows are session-independent).
    pub merges: bool,
    /// The kind's names, metric and answers.
    pub flavor: &'static Flavor,
    /// The table the rows go to ([`Merger::table`]).
    pub table: Option<MergeTable>,
}

impl Inserts {
    /// The merger, as a plan carries it.
    pub fn merger(
        merges: bool,
        flavor: &'static Flavor,
        table: Option<MergeTable>,
    ) -> Arc<dyn Merger> {
        Arc::new(Inserts {
            merges,
            flavor,
            table,
        })
    }
}

impl Merger for Inserts {
    fn table(&self) -> Option<&MergeTable> {
        self.table.as_ref()
    }

    fn name(&self) -> &'static str {
        if self.merges {
            self.flavor.name
        } else {
            self.flavor.name_alone
        }
    }

    fn explain(&self) -> Option<&'static str> {
        self.merges.then_some(self.flavor.explain)
    }

    fn metric(&self) -> &'static MergeMetric {
        self.flavor.metric
    }

    fn limits(&self) -> Limits {
        Limits {
            items: MAX_ROWS,
            bytes: MAX_VALUES_BYTES,
        }
    }

    fn part<'a>(&self, aux: &'a [Vec<u8>]) -> Option<(Vec<&'a [u8]>, Part)> {
        if !self.merges {
            return None;
        }
        let p = InsertPieces::of(aux)?;
        let part = Part {
            sums: Vec::new(),
            text: p.tuples.clone(),
            items: p.row_count()?,
            order: p.order.clone(),
        };
        Some((vec![p.prefix.as_slice(), p.suffix.as_slice()], part))
    }

    fn statement(&self, aux: &[Vec<u8>]) -> Option<Vec<u8>> {
        let p = InsertPieces::of(aux)?;
        let mut sql = p.prefix.clone();
        sql.extend_from_slice(p.tuples);
        sql.extend_from_slice(p.suffix);
        Some(sql)
    }

    fn merged(&self, aux: &[Vec<u8>], parts: &[Part], _sums: &[i64]) -> Option<Merged> {
        let mut order: Vec<usize> = (0..parts.len()).collect();
        order.sort_by(|a, b| parts[*a].order.cmp(&parts[*b].order));
        let p = InsertPieces::of(aux)?;
        let bytes: usize = parts.iter().map(|p| p.text.len() + 2).sum();
        let mut sql = Vec::with_capacity(p.prefix.len() + bytes + p.suffix.len() + 32);
        sql.extend_from_slice(p.prefix);
        for (n, &i) in order.iter().enumerate() {
            if n > 0 {
                sql.extend_from_slice(b", ");
            }
            sql.extend_from_slice(&parts[i].text);
        }
        sql.extend_from_slice(p.suffix);
        Some(Merged { sql, order })
    }

    fn returning<'a>(&self, aux: &'a [Vec<u8>]) -> Option<&'a [u8]> {
        InsertPieces::of(aux)?.ai()
    }

    /// The OK packet of an upsert of several rows reports the id of its first row
    /// that took a new slot rather than its first row's; `RETURNING` gives every
    /// row's.
    fn returning_alone<'a>(&self, aux: &'a [Vec<u8>]) -> Option<&'a [u8]> {
        if !self.flavor.returning_alone {
            return None;
        }
        let p = InsertPieces::of(aux)?;
        let ai = p.ai()?;
        (p.row_count()? > 1).then_some(ai)
    }

    fn alone_after_failure(&self, members: usize) -> bool {
        // The error may be one member's doing (a foreign key, a CHECK, a duplicate
        // key). A lone member's write is its own insert with its rows in its own
        // order: it gets the error, and runs once (a second run would take the
        // AUTO_INCREMENT values a failed insert already used up a second time).
        members > 1
    }

    fn routes_warnings(&self) -> bool {
        true
    }

    fn lanes(&self) -> u32 {
        self.flavor.lanes
    }

    fn answer_alone(&self, written: Option<&Written>) -> Result<OkSummary, &'static str> {
        let Some(w) = written else {
            return Err("heatsink: an insert was written but its response was not understood");
        };
        Ok(OkSummary {
            affected_rows: w.ids.len() as u64,
            last_insert_id: w.ids.first().copied().unwrap_or(0),
            status: 0,
            warnings: w.warnings,
        })
    }

    fn answer(&self, written: Option<&Written>, member: Member) -> Result<OkSummary, &'static str> {
        let Some(w) = written else {
            return Err(
                "heatsink: a merged insert was written but its response was not understood",
            );
        };
        Ok(OkSummary {
            affected_rows: member.items,
            last_insert_id: usize::try_from(member.first)
                .ok()
                .and_then(|i| w.ids.get(i))
                .copied()
                .unwrap_or(0),
            status: 0,
            warnings: w.warnings,
        })
    }
}

/// A value that is the same whichever session evaluates it (at about the same time):
/// a literal, or a clock function of literals. Only such rows may be merged into
/// another session's write.
pub fn session_independent(e: &Expr) -> bool {
    const CLOCKS: &[&str] = &[
        "NOW",
        "CURRENT_TIMESTAMP",
        "LOCALTIME",
        "LOCALTIMESTAMP",
        "SYSDATE",
        "UTC_TIMESTAMP",
        "CURDATE",
        "CURRENT_DATE",
        "UTC_DATE",
        "CURTIME",
        "CURRENT_TIME",
        "UTC_TIME",
        "UNIX_TIMESTAMP",
    ];
    match e {
        Expr::Function(f) => {
            let name = f.name.to_string();
            CLOCKS.iter().any(|c| c.eq_ignore_ascii_case(&name)) && match &f.args {
                FunctionArguments::None => true,
                FunctionArguments::List(l) => l.args.iter().all(
                    |a| matches!(a, FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) if is_value(e)),
                ),
                FunctionArguments::Subquery(_) => false,
            }
        }
        Expr::Nested(inner) => session_independent(inner),
        e => is_value(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static METRIC: MergeMetric = MergeMetric {
        name: "rows_total",
        help: "Rows.",
    };
    static TEST: Flavor = Flavor {
        name: "insert",
        name_alone: "insert, alone",
        explain: "merged",
        metric: &METRIC,
        returning_alone: true,
        lanes: 1,
    };

    fn aux(ai: &str, rows: &str) -> Vec<Vec<u8>> {
        InsertPieces {
            prefix: &b"INSERT INTO r (k, v, slot, seq) VALUES ".to_vec(),
            tuples: &b"(2, 'b', NULL, NULL)".to_vec(),
            suffix: &b" ON DUPLICATE KEY UPDATE v = VALUES(v)".to_vec(),
            order: &b"2".to_vec(),
            rows: &rows.as_bytes().to_vec(),
            ai_column: &ai.as_bytes().to_vec(),
        }
        .to_aux()
    }

    fn part(tuples: &str, rows: u64, order: &str) -> Part {
        Part {
            text: tuples.as_bytes().to_vec(),
            items: rows,
            order: order.as_bytes().to_vec(),
            ..Part::default()
        }
    }

    #[test]
    fn parts_are_written_in_key_order() {
        let m = Inserts {
            merges: true,
            flavor: &TEST,
            table: None,
        };
        let a = aux("", "1");
        let (target, mine) = m.part(&a).unwrap();
        assert_eq!(target, vec![&a[0][..], &a[2][..]]);
        assert_eq!(mine, part("(2, 'b', NULL, NULL)", 1, "2"));
        let parts = [
            mine,
            part("(1, 'a', NULL, NULL), (1, 'c', NULL, NULL)", 2, "1"),
        ];
        let merged = m.merged(&a, &parts, &[]).unwrap();
        assert_eq!(merged.order, vec![1, 0]);
        assert_eq!(
            String::from_utf8(merged.sql).unwrap(),
            "INSERT INTO r (k, v, slot, seq) VALUES (1, 'a', NULL, NULL), (1, 'c', NULL, NULL), \
             (2, 'b', NULL, NULL) ON DUPLICATE KEY UPDATE v = VALUES(v)"
        );
        assert!(Inserts {
            merges: false,
            flavor: &TEST,
            table: None,
        }
        .part(&a)
        .is_none());
    }

    #[test]
    fn returning_and_answers() {
        let m = Inserts {
            merges: true,
            flavor: &TEST,
            table: None,
        };
        assert_eq!(m.returning(&aux("", "2")), None);
        assert_eq!(m.returning(&aux("`id`", "1")), Some(&b"`id`"[..]));
        assert_eq!(m.returning_alone(&aux("`id`", "1")), None);
        assert_eq!(m.returning_alone(&aux("`id`", "2")), Some(&b"`id`"[..]));
        let w = Written {
            ids: vec![7, 8, 9],
            warnings: 1,
        };
        let ok = m.answer(Some(&w), Member { first: 1, items: 2 }).unwrap();
        assert_eq!(
            (ok.affected_rows, ok.last_insert_id, ok.warnings),
            (2, 8, 1)
        );
        assert!(m.answer(None, Member { first: 0, items: 1 }).is_err());
        let ok = m.answer_alone(Some(&w)).unwrap();
        assert_eq!(
            (ok.affected_rows, ok.last_insert_id, ok.warnings),
            (3, 7, 1)
        );
    }
}
