//! Column definitions: the names, types and flags of the columns the client
//! sees, as the original read of the log would give them.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{Filter, Group, Item, Shape};
use crate::kinds::rollup::rule::RollupRule;
use crate::kinds::rollup::spec::Measure;
use crate::rewrite::shape::eq;
use crate::rewrite::{ColumnPatch, PlanFlags};
use crate::wire::resultset::{types, ColumnDef};

impl<'q> Shape<'q> {
    /// Column definitions as the log's read would have them. Their flags depend on
    /// the plan MariaDB picks for the original read ([`PlanMode`]), which the
    /// rewrite predicts from the shape and the log's keys.
    pub(super) fn patch(&self, rule: &RollupRule, meta: &[ColumnDef]) -> Option<ColumnPatch> {
        self.patch_for(rule, meta, self.plan_mode(rule, meta))
    }

    /// The patches of each plan MariaDB may pick for a read whose plan the shape
    /// does not settle ([`Shape::plan_unsettled`]), chosen by the server's own
    /// plan of the read at each execution; `None` when the shape settles it.
    pub(super) fn flags_by_plan(
        &self,
        rule: &RollupRule,
        meta: &[ColumnDef],
        one_step_only: bool,
    ) -> Option<Option<FlagsByPlan>> {
        if !self.plan_unsettled(rule, meta, one_step_only) {
            return Some(None);
        }
        let open = self
            .open_groups()
            .into_iter()
            .map(|g| match g {
                Group::Dim(d) => rule.logical.key()[d].to_ascii_lowercase(),
                // Never the name of an index's column: no index gives its order.
                Group::Time => String::new(),
            })
            .collect();
        let by_aggregate = self.orders_by_aggregate();
        Some(Some(FlagsByPlan {
            open,
            by_aggregate,
            index: Arc::new(self.patch_for(rule, meta, PlanMode::Index)?),
            index_then_temporary: match by_aggregate {
                true => Some(Arc::new(self.patch_for(
                    rule,
                    meta,
                    PlanMode::IndexThenTemporary,
                )?)),
                false => None,
            },
            temporary: Arc::new(self.patch_for(rule, meta, PlanMode::Temporary)?),
        }))
    }

    /// Column definitions as the log's read would have them under plan `mode`.
    fn patch_for(
        &self,
        rule: &RollupRule,
        meta: &[ColumnDef],
        mode: PlanMode,
    ) -> Option<ColumnPatch> {
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
        if self.group.is_none() {
            return PlanMode::Ungrouped;
        }
        let ranged = self.lower.is_some() || self.upper.is_some();
        match self.open_groups().as_slice() {
            [] => PlanMode::Index,
            [Group::Dim(d)] if self.dim_flags(rule, meta, *d) & LEADING_FLAGS != 0 && !ranged => {
                if self.orders_by_aggregate() {
                    PlanMode::IndexThenTemporary
                } else {
                    PlanMode::Index
                }
            }
            _ => PlanMode::Temporary,
        }
    }

    /// Whether the plan MariaDB picks for the read, as far as column flags tell,
    /// depends on the data rather than the shape: a grouped column is part of an
    /// index (so the groups may be read in its order), and something competes with
    /// it — a time range, another filtered column of an index, another grouped
    /// column. The one case the shape settles is one grouped column that leads an
    /// index, filtered by nothing but itself (and columns fixed to one value that
    /// are not in an index). A read with the one-step form only (prepared, or of a
    /// TIMESTAMP log) has no prelude that checks its range: an empty one
    /// (`BETWEEN ? AND ?` or two literals, the lower bound after the upper) is an
    /// "Impossible WHERE", which MariaDB answers without grouping and with the
    /// table's flags (a text read's prelude runs such a read as sent).
    pub(super) fn plan_unsettled(
        &self,
        rule: &RollupRule,
        meta: &[ColumnDef],
        one_step_only: bool,
    ) -> bool {
        if self.group.is_none() {
            return false;
        }
        let ranged = self.lower.is_some() || self.upper.is_some();
        if one_step_only && ranged {
            return true;
        }
        let open = self.open_groups();
        let keyed = |d: usize| self.dim_flags(rule, meta, d) & ANY_KEY_FLAGS != 0;
        if !open.iter().any(|g| matches!(g, Group::Dim(d) if keyed(*d))) {
            // No index holds a grouped column: a temporary table, whatever the data.
            return false;
        }
        let [Group::Dim(grouped)] = open.as_slice() else {
            return true;
        };
        let competing = self.filters.iter().any(|f| {
            let d = match f {
                Filter::Value { dim, .. } | Filter::IsNull(dim) | Filter::NotNull(dim) => *dim,
            };
            d != *grouped && keyed(d)
        });
        ranged || competing || self.dim_flags(rule, meta, *grouped) & LEADING_FLAGS == 0
    }

    /// The grouped entries not fixed to one value by the WHERE clause.
    fn open_groups(&self) -> Vec<Group> {
        self.group
            .iter()
            .flatten()
            .copied()
            .filter(|g| !matches!(g, Group::Dim(d) if self.is_const(*d)))
            .collect()
    }

    /// The log column's flags of dimension `d` (0 when the log has no such column).
    fn dim_flags(&self, rule: &RollupRule, meta: &[ColumnDef], d: usize) -> u16 {
        let name = &rule.logical.key()[d];
        meta.iter()
            .find(|c| eq(&String::from_utf8_lossy(&c.org_name), name))
            .map_or(0, |c| c.flags)
    }

    /// Whether `ORDER BY` names an aggregate of the read.
    fn orders_by_aggregate(&self) -> bool {
        self.items.iter().any(|i| match i {
            Item::Agg { alias, .. } => self.order_by_names(alias),
            _ => false,
        })
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
/// A column that leads an index (MariaDB sets these on an index's first column).
const LEADING_FLAGS: u16 = PRI_KEY_FLAG | UNIQUE_KEY_FLAG | MULTIPLE_KEY_FLAG;
/// A column in any index.
const ANY_KEY_FLAGS: u16 = LEADING_FLAGS | PART_KEY_FLAG;

/// How the original read would run (see [`Shape::plan_mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PlanMode {
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

/// The column patches of a read whose plan the shape does not settle, one per plan
/// MariaDB may pick, chosen by the server's plan of the read (`EXPLAIN
/// FORMAT=JSON`, see [`crate::rewrite::Plan::plan_flags`]).
#[derive(Debug)]
pub(super) struct FlagsByPlan {
    /// The grouped columns not fixed to one value, lower-cased (empty for the
    /// time series).
    open: Vec<String>,
    /// `ORDER BY` names an aggregate.
    by_aggregate: bool,
    /// Grouped in index order.
    index: Arc<ColumnPatch>,
    /// Grouped in index order, then sorted by an aggregate through a temporary
    /// table (when `ORDER BY` names one).
    index_then_temporary: Option<Arc<ColumnPatch>>,
    /// Grouped through a temporary table.
    temporary: Arc<ColumnPatch>,
}

impl PlanFlags for FlagsByPlan {
    fn name(&self) -> &'static str {
        "rollup column flags"
    }

    fn patch(&self, explain: &[u8]) -> Option<Arc<ColumnPatch>> {
        match explained_mode(explain, &self.open, self.by_aggregate)? {
            PlanMode::Index => Some(self.index.clone()),
            PlanMode::IndexThenTemporary => self.index_then_temporary.clone(),
            PlanMode::Temporary => Some(self.temporary.clone()),
            PlanMode::Ungrouped => None,
        }
    }
}

/// The plan mode `EXPLAIN FORMAT=JSON` of a grouped read of one table tells, as
/// measured against MariaDB 10.11 (docs/design.md, "Column definitions"): no
/// temporary table and no sort, the rows read through an index whose first column
/// is the one grouped column — grouped in index order; a temporary table with the
/// rows read through another index or none — grouped through it; a temporary
/// table with the rows read through the grouped column's index, sorted by an
/// aggregate — grouped in index order, then sorted. Anything else (a sort without
/// a temporary table, a loose index scan, a message instead of a table, several
/// tables, a key whose first column is another grouped one) is `None`: not
/// measured, so not guessed. `open`: the grouped columns not fixed to one value,
/// lower-cased; `by_aggregate`: `ORDER BY` names an aggregate.
pub(super) fn explained_mode(
    explain: &[u8],
    open: &[String],
    by_aggregate: bool,
) -> Option<PlanMode> {
    let doc: Value = serde_json::from_slice(explain).ok()?;
    let mut node = doc.as_object()?.get("query_block")?.as_object()?;
    let (mut temporary, mut sorted) = (false, false);
    // The nodes above the table: at most a sort and a temporary table.
    let table = loop {
        if node.keys().any(|k| {
            !matches!(
                k.as_str(),
                "select_id"
                    | "cost"
                    | "sort_key"
                    | "filesort"
                    | "temporary_table"
                    | "nested_loop"
                    | "table"
            )
        }) {
            return None;
        }
        if let Some(f) = node.get("filesort") {
            if sorted || temporary {
                return None;
            }
            sorted = true;
            node = f.as_object()?;
        } else if let Some(t) = node.get("temporary_table") {
            if temporary {
                return None;
            }
            temporary = true;
            node = t.as_object()?;
        } else if let Some(n) = node.get("nested_loop") {
            let [one] = n.as_array()?.as_slice() else {
                return None;
            };
            let one = one.as_object()?;
            if one.len() != 1 {
                return None;
            }
            break one.get("table")?.as_object()?;
        } else {
            break node.get("table")?.as_object()?;
        }
    };
    if ["message", "using_index_for_group_by"]
        .iter()
        .any(|k| table.contains_key(*k))
    {
        return None;
    }
    let first_part = first_key_part(table);
    let grouped_index = first_part.is_some_and(|p| open.contains(&p));
    match (temporary, sorted) {
        (false, false) => (grouped_index && open.len() == 1 && table.contains_key("key"))
            .then_some(PlanMode::Index),
        (true, _) if !grouped_index => Some(PlanMode::Temporary),
        (true, _) if open.len() == 1 && by_aggregate => Some(PlanMode::IndexThenTemporary),
        _ => None,
    }
}

/// The first column of the index a table is read through, lower-cased: the first
/// of `used_key_parts` (the parts of the index the read uses start with its
/// first).
fn first_key_part(table: &Map<String, Value>) -> Option<String> {
    table.get("key")?;
    let parts = table.get("used_key_parts")?.as_array()?;
    Some(parts.first()?.as_str()?.to_ascii_lowercase())
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
