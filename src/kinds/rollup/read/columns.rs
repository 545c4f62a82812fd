//! Column definitions: the names, types and flags of the columns the client
//! sees, as the original read of the log would give them.

use super::{Filter, Group, Item, Shape};
use crate::kinds::rollup::rule::RollupRule;
use crate::kinds::rollup::spec::Measure;
use crate::rewrite::shape::eq;
use crate::rewrite::ColumnPatch;
use crate::wire::resultset::{types, ColumnDef};

impl<'q> Shape<'q> {
    /// Column definitions as the log's read would have them. Their flags depend on
    /// the plan MariaDB picks for the original read ([`Plan`]), which the rewrite
    /// predicts from the shape and the log's keys.
    pub(super) fn patch(&self, rule: &RollupRule, meta: &[ColumnDef]) -> Option<ColumnPatch> {
        let mode = self.plan_mode(rule, meta);
        let mut computed = Vec::new();
        let mut set_flags = Vec::new();
        for i in &self.items {
            match i {
                Item::Dim { dim, .. } => {
                    let name = &rule.logical.key()[*dim];
                    let mut def = meta
                        .iter()
                        .find(|d| eq(&String::from_utf8_lossy(&d.org_name), name))?
                        .clone();
                    def.table = self.alias.as_bytes().to_vec();
                    def.flags = mode.column_flags(def.flags, self.is_const(*dim));
                    computed.push((name.to_ascii_lowercase(), def));
                }
                // Found by the name the derived table gives the column (the alias;
                // the client's name of an unaliased one is only the outer `AS`).
                Item::Agg {
                    measure: Measure::Sum(c),
                    alias,
                    ..
                } => {
                    let col = meta
                        .iter()
                        .find(|d| eq(&String::from_utf8_lossy(&d.org_name), c))?;
                    computed.push((alias.to_ascii_lowercase(), sum_def(col, mode)?));
                }
                Item::Agg { alias, .. } => {
                    computed.push((alias.to_ascii_lowercase(), count_def(mode.count_flags())));
                }
                // Computed by the outer query itself from a DATETIME, as from the
                // log's; grouped through a temporary table.
                Item::Time { alias, .. } => {
                    let time = meta
                        .iter()
                        .find(|d| eq(&String::from_utf8_lossy(&d.org_name), &rule.time))?;
                    let flags = if time.flags & NOT_NULL_FLAG != 0 {
                        NOT_NULL_FLAG
                    } else {
                        GROUP_FLAG
                    };
                    set_flags.push((alias.to_ascii_lowercase(), flags));
                }
            }
        }
        Some(ColumnPatch {
            tables: vec![self.alias.clone()],
            columns: Vec::new(),
            flags_from_logical: false,
            materialized: Vec::new(),
            keyed: Vec::new(),
            computed,
            set_flags,
        })
    }

    /// How MariaDB would run the original read, as far as column flags tell:
    /// without `GROUP BY`; with every grouped column fixed to one value by the WHERE
    /// clause (one group, no temporary table); grouping one column that leads an
    /// index of the log (and no time range that could pick another index) in index
    /// order, then sorting through a temporary table only when `ORDER BY` names an
    /// aggregate; otherwise grouping through a temporary table. The optimizer may
    /// choose otherwise on other data; only column flags depend on it.
    fn plan_mode(&self, rule: &RollupRule, meta: &[ColumnDef]) -> PlanMode {
        let Some(group) = &self.group else {
            return PlanMode::Ungrouped;
        };
        let open: Vec<Group> = group
            .iter()
            .copied()
            .filter(|g| !matches!(g, Group::Dim(d) if self.is_const(*d)))
            .collect();
        let leading = |d: usize| {
            let name = &rule.logical.key()[d];
            meta.iter()
                .find(|c| eq(&String::from_utf8_lossy(&c.org_name), name))
                .is_some_and(|c| {
                    c.flags & (PRI_KEY_FLAG | UNIQUE_KEY_FLAG | MULTIPLE_KEY_FLAG) != 0
                })
        };
        let ranged = self.lower.is_some() || self.upper.is_some();
        match open.as_slice() {
            [] => PlanMode::Index,
            [Group::Dim(d)] if leading(*d) && !ranged => {
                let by_aggregate = self.items.iter().any(|i| match i {
                    Item::Agg { alias, .. } => self.order_by_names(alias),
                    _ => false,
                });
                if by_aggregate {
                    PlanMode::IndexThenTemporary
                } else {
                    PlanMode::Index
                }
            }
            _ => PlanMode::Temporary,
        }
    }

    /// Whether the WHERE clause fixes dimension `dim` to one value (`d = v`).
    fn is_const(&self, dim: usize) -> bool {
        self.filters
            .iter()
            .any(|f| matches!(f, Filter::Value { dim: d, single: true, .. } if *d == dim))
    }

    /// Whether the `ORDER BY` clause mentions `name`.
    fn order_by_names(&self, name: &str) -> bool {
        let lower = self.order_by.to_ascii_lowercase();
        let name = name.to_ascii_lowercase();
        lower
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
            .any(|w| w == name)
    }
}

/// Column flags: NOT NULL, keys, BINARY, AUTO_INCREMENT, and the group flag a
/// nullable column grouped through a temporary table carries.
const NOT_NULL_FLAG: u16 = 0x0001;
const PRI_KEY_FLAG: u16 = 0x0002;
const UNIQUE_KEY_FLAG: u16 = 0x0004;
const MULTIPLE_KEY_FLAG: u16 = 0x0008;
const BINARY_FLAG: u16 = 0x0080;
const AUTO_INCREMENT_FLAG: u16 = 0x0200;
const PART_KEY_FLAG: u16 = 0x4000;
const GROUP_FLAG: u16 = 0x8000;
const KEY_FLAGS: u16 =
    PRI_KEY_FLAG | UNIQUE_KEY_FLAG | MULTIPLE_KEY_FLAG | PART_KEY_FLAG | AUTO_INCREMENT_FLAG;

/// How the original read would run (see [`Shape::plan_mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlanMode {
    /// No `GROUP BY`: one row of aggregates.
    Ungrouped,
    /// Grouped in index order, rows sent as read.
    Index,
    /// Grouped in index order, then sorted through a temporary table.
    IndexThenTemporary,
    /// Grouped through a temporary table.
    Temporary,
}

impl PlanMode {
    /// A grouped column's flags, from the log column's; `fixed`: the WHERE clause
    /// fixes it to one value, so it is not grouped by.
    fn column_flags(self, base: u16, fixed: bool) -> u16 {
        match self {
            PlanMode::Ungrouped | PlanMode::Index => base,
            PlanMode::IndexThenTemporary => base & !KEY_FLAGS,
            PlanMode::Temporary if fixed || base & NOT_NULL_FLAG != 0 => base & !KEY_FLAGS,
            PlanMode::Temporary => (base & !KEY_FLAGS) | GROUP_FLAG,
        }
    }

    /// A `COUNT` column's flags.
    fn count_flags(self) -> u16 {
        match self {
            PlanMode::Ungrouped | PlanMode::Index => NOT_NULL_FLAG | BINARY_FLAG,
            PlanMode::IndexThenTemporary | PlanMode::Temporary => NOT_NULL_FLAG,
        }
    }
}

/// MariaDB's definition of a `COUNT(…)` column: `BIGINT(21) NOT NULL`, binary, with
/// the flags of the read's plan.
fn count_def(flags: u16) -> ColumnDef {
    ColumnDef {
        catalog: b"def".to_vec(),
        schema: Vec::new(),
        table: Vec::new(),
        org_table: Vec::new(),
        name: Vec::new(),
        org_name: Vec::new(),
        extended: None,
        charset: 63,
        length: 21,
        column_type: types::LONGLONG,
        flags,
        decimals: 0,
        fixed_len: 0x0c,
        tail: vec![0, 0],
    }
}

/// MariaDB's definition of `SUM(col)` over an exact numeric column: `DECIMAL(p +
/// 22, s)` of the column's precision `p` and scale `s`, nullable, with the flags of
/// the read's plan. `None` for a column of another type.
fn sum_def(col: &ColumnDef, mode: PlanMode) -> Option<ColumnDef> {
    const UNSIGNED_FLAG: u16 = 0x0020;
    let signed = u32::from(col.flags & UNSIGNED_FLAG == 0);
    let scale = u32::from(col.decimals);
    let precision = match col.column_type {
        types::TINY | types::SHORT | types::INT24 | types::LONG | types::LONGLONG => {
            col.length.checked_sub(signed)?
        }
        types::NEWDECIMAL => col.length.checked_sub(signed + u32::from(scale > 0))?,
        _ => return None,
    };
    let precision = (precision + 22).min(65);
    let mut def = count_def(match mode.count_flags() & BINARY_FLAG {
        0 => 0,
        _ => BINARY_FLAG,
    });
    def.column_type = types::NEWDECIMAL;
    def.length = precision + 1 + u32::from(scale > 0);
    def.decimals = col.decimals;
    Some(def)
}
