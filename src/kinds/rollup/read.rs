//! Aggregate reads of the log, answered from the rollup.
//!
//! A read the rollup can answer has this shape (any order of conjuncts, `ORDER BY`
//! over output columns, `LIMIT`):
//!
//! ```sql
//! SELECT <dims…>, COUNT(*) AS a [, COUNT(col) AS b] [, SUM(col) AS c] FROM log [AS x]
//!  WHERE <dim> = v AND <dim> IN (…) AND <dim> IS [NOT] NULL
//!    AND <time> >= L AND <time> < U        -- or >, <=, BETWEEN; either bound optional
//!  [GROUP BY <dims…>] [ORDER BY …] [LIMIT …]
//! ```
//!
//! where every filtered and grouped column is one of the rollup's dimensions. An
//! unaliased aggregate is named by MariaDB by its text as the client spelt it
//! (`count( * )`): it is computed under an alias of the proxy's own and renamed to
//! that text in the outer query, and the plan is cached per spelling of the select
//! list ([`PlanContext::spelt_item`]). It becomes
//!
//! ```sql
//! SELECT x.<dim> AS <dim as written>…, x.a FROM (
//!   SELECT hs_u.<dim>…, CAST(COALESCE(SUM(hs_u.hs_rows), 0) AS SIGNED) AS a
//!   FROM (
//!     SELECT IF(x.hs_nulls & bit <> 0, NULL, x.<dim>) AS <dim>…, x.hs_rows …
//!       FROM rollup AS x WHERE <dim filters> AND x.hs_bucket >= S AND x.hs_bucket < E
//!     UNION ALL
//!     SELECT x.<dim>…, 1 AS hs_rows … FROM log AS x
//!      WHERE <the original WHERE> AND (x.<time> < S OR x.<time> >= E)
//!   ) AS hs_u GROUP BY hs_u.<dim>… HAVING SUM(hs_u.hs_rows) > 0
//! ) AS x ORDER BY <the original ORDER BY, or the group columns> LIMIT …
//! ```
//!
//! `S` is the first bucket that starts inside the range, `E` the start of the
//! bucket holding its upper bound, both computed by the server from the statement's
//! own bound expressions (so `NOW()` and the session's time zone mean what they mean
//! to the log). Whole buckets in `[S, E)` come from the rollup, the ragged edges from
//! the log, so any range is exact. Without a time predicate every row of the rollup
//! counts (also rows whose time is NULL) and the log is not read.

use std::sync::Arc;

use sqlparser::ast::{
    BinaryOperator, DuplicateTreatment, Expr, FunctionArg, FunctionArgExpr, FunctionArguments,
    GroupByExpr, LimitClause, ObjectName, OrderByKind, Query, SelectItem, SetExpr, TableWithJoins,
    UnaryOperator,
};

use super::plan::{RollupRule, Tier};
use super::spec::{Bucket, Measure};
use crate::rewrite::shape::{column_name, conjuncts, eq, is_value};
use crate::rewrite::{
    parse_statements, ColumnPatch, Plan, PlanContext, Prelude, Refusal, Reply, TableName,
};
use crate::rules::spec::quote;
use crate::wire::resultset::{types, ColumnDef};

/// Why a read that aggregates the log in a shape no rollup of the rule answers
/// falls back.
const SHAPE_NOT_ANSWERED: &str =
    "the rollup cannot answer this read's shape: its groups, aggregates, filters or clauses";

/// Bit of `hs_nulls` set when the time column is NULL.
const TIME_NULL_BIT: u64 = 1 << 31;

/// The plan answering `q` from the rollup, or `None` when the rollup cannot answer
/// it exactly (the read then goes to the log unchanged).
///
/// A read that aggregates the log (`COUNT`, `SUM`, `GROUP BY`) but that this rollup
/// cannot answer is a [`Plan::fallback`]: forwarded unchanged and counted.
pub(super) fn plan_read(
    rule: &RollupRule,
    q: &Query,
    ctx: &PlanContext<'_>,
) -> Result<Option<Plan>, Refusal> {
    let Some(mut shape) = Shape::of(rule, q, ctx) else {
        return Ok(aggregates(q).then(|| Plan::fallback(SHAPE_NOT_ANSWERED)));
    };
    let meta = rule.logical.columns(ctx)?;
    shape.utc = meta.iter().any(|d| {
        d.column_type == types::TIMESTAMP && eq(&String::from_utf8_lossy(&d.org_name), &rule.time)
    });
    if shape.utc && shape.time_alias().is_some() {
        // Days and hours of the session's time zone are not the rollup's UTC
        // buckets.
        return Ok(Some(Plan::fallback(
            "the read groups a TIMESTAMP log by days or hours of the session's time zone, which are not the rollup's UTC buckets",
        )));
    }
    if !shape.filters_compare_as_stored(rule, &meta, ctx) {
        return Ok(Some(Plan::fallback(
            "a filter compares a column with a value of another kind, whose result depends on the server's plan",
        )));
    }
    // The one-step form computes bucket boundaries from the bounds' expressions,
    // which a zero date, a number or a year near 9999 turn into NULLs that
    // comparisons and `IS NULL` read differently under NO_ZERO_DATE, or into
    // warnings the log's read does not give. Prepared statements and TIMESTAMP
    // logs have only that form: other bounds fall back. Text reads check the
    // values in their prelude and forward the statement when it declines them.
    let one_step_only = ctx.prepared || shape.utc;
    if one_step_only
        && [&shape.lower, &shape.upper]
            .into_iter()
            .flatten()
            .any(|b| !plain_bound(b.expr, ctx))
    {
        return Ok(Some(Plan::fallback(
            "a time bound is not a plain date (a prepared statement or a TIMESTAMP log has only the one-step form, exact for plain dates only)",
        )));
    }
    let sql = shape.sql(rule);
    let statements = parse_statements(&sql).map_err(|e| {
        Refusal::internal(format!(
            "internal error: the rollup read does not parse ({e})"
        ))
    })?;
    let Some(patch) = shape.patch(rule, &meta) else {
        return Ok(Some(Plan::fallback(
            "the rollup cannot give the read's column definitions exactly as the log's read would",
        )));
    };
    let prelude = match shape.prelude_sql(rule, &meta, ctx) {
        Some((query, values, then)) => Some(Prelude {
            query: parse_statements(&query).map_err(|e| {
                Refusal::internal(format!(
                    "internal error: the rollup read's prelude does not parse ({e})"
                ))
            })?,
            values,
            statements: parse_statements(&then).map_err(|e| {
                Refusal::internal(format!(
                    "internal error: the rollup read with literal bounds does not parse ({e})"
                ))
            })?,
            original_on_decline: true,
        }),
        None => None,
    };
    Ok(Some(Plan {
        statements,
        reply: Reply::Patched(Arc::new(patch)),
        prelude,
        ..Default::default()
    }))
}

/// Whether a query's top SELECT aggregates: `GROUP BY`, or a `COUNT`/`SUM` in its
/// select list.
fn aggregates(q: &Query) -> bool {
    let SetExpr::Select(sel) = q.body.as_ref() else {
        return false;
    };
    let grouped = !matches!(&sel.group_by, GroupByExpr::Expressions(e, _) if e.is_empty());
    grouped
        || sel.projection.iter().any(|item| {
            let e = match item {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
                _ => return false,
            };
            matches!(e, Expr::Function(f) if f.name.0.len() == 1
            && f.name.0[0].as_ident().is_some_and(|i| {
                i.value.eq_ignore_ascii_case("count") || i.value.eq_ignore_ascii_case("sum")
            }))
        })
}

/// An output column of the read.
enum Item<'q> {
    /// A dimension (index into the rule's dimensions), named as written.
    Dim { dim: usize, name: String },
    /// An aggregate under its alias; `name`: the client's spelling of an unaliased
    /// one, the output column's name (the alias is then the proxy's `hs_agg<i>`).
    Agg {
        measure: Measure,
        alias: String,
        name: Option<String>,
    },
    /// The time series: `DATE(time)` or `DATE_FORMAT(time, fmt)` under its alias.
    Time {
        format: Option<&'q Expr>,
        alias: String,
    },
}

/// A `GROUP BY` entry.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Group {
    /// A dimension (index into the rule's dimensions).
    Dim(usize),
    /// The time series item.
    Time,
}

/// A conjunct of the WHERE clause on a dimension.
enum Filter<'q> {
    /// `d = v` (`single`) or `d IN (…)`: printed as written; the dimension is not
    /// NULL.
    Value {
        dim: usize,
        expr: &'q Expr,
        single: bool,
    },
    /// `d IS NULL`.
    IsNull(usize),
    /// `d IS NOT NULL`.
    NotNull(usize),
}

/// A bound of the time range: the expression and whether it is strict.
struct Bound<'q> {
    expr: &'q Expr,
    strict: bool,
}

/// A read the rollup can answer, taken apart.
struct Shape<'q> {
    /// The log's name as the statement wrote it.
    table: &'q ObjectName,
    /// The alias the statement reads the log under (its name when none).
    alias: String,
    /// Output columns, in order.
    items: Vec<Item<'q>>,
    /// `GROUP BY` entries, in order; `None` without `GROUP BY`.
    group: Option<Vec<Group>>,
    /// The WHERE clause as written.
    selection: Option<&'q Expr>,
    /// Its dimension conjuncts.
    filters: Vec<Filter<'q>>,
    /// Time range bounds.
    lower: Option<Bound<'q>>,
    upper: Option<Bound<'q>>,
    /// `ORDER BY …` and `LIMIT …` as written (empty when absent).
    order_by: String,
    limit: String,
    /// The time column is a TIMESTAMP: the rollup's buckets are of UTC.
    utc: bool,
}

impl<'q> Shape<'q> {
    /// Takes `q` apart, or `None` when it has any other shape.
    fn of(rule: &RollupRule, q: &'q Query, ctx: &PlanContext<'_>) -> Option<Shape<'q>> {
        let sel = crate::rewrite::shape::plain_select(q)?;
        let (table, alias) = source(rule, &sel.from, ctx)?;
        let mut shape = Shape {
            table,
            alias,
            items: Vec::new(),
            group: None,
            selection: sel.selection.as_ref(),
            filters: Vec::new(),
            lower: None,
            upper: None,
            order_by: String::new(),
            limit: String::new(),
            utc: false,
        };
        shape.projection(rule, &sel.projection, ctx)?;
        shape.group = shape.group_by(rule, &sel.group_by, ctx)?;
        shape.grouped_items()?;
        if let Some(w) = &sel.selection {
            shape.predicates(rule, w)?;
        }
        shape.order_and_limit(q)?;
        Some(shape)
    }

    /// The dimension `e` names (unqualified, or qualified by the statement's alias).
    fn dim_of(&self, rule: &RollupRule, e: &Expr) -> Option<usize> {
        let name = self.column_of(e)?;
        rule.logical.key().iter().position(|d| eq(d, &name))
    }

    /// The column `e` names, if it is a column of the log as the statement reads it.
    fn column_of(&self, e: &Expr) -> Option<String> {
        match e {
            Expr::Identifier(i) => Some(i.value.clone()),
            Expr::CompoundIdentifier(p) if p.len() == 2 && eq(&p[0].value, &self.alias) => {
                Some(p[1].value.clone())
            }
            Expr::Nested(inner) => self.column_of(inner),
            _ => None,
        }
    }

    /// The `GROUP BY` entries: dimensions, and the time series item named by its
    /// alias, its position or its expression.
    fn group_by(
        &self,
        rule: &RollupRule,
        g: &GroupByExpr,
        ctx: &PlanContext<'_>,
    ) -> Option<Option<Vec<Group>>> {
        let GroupByExpr::Expressions(exprs, modifiers) = g else {
            return None;
        };
        if !modifiers.is_empty() {
            return None;
        }
        if exprs.is_empty() {
            return Some(None);
        }
        let mut group = Vec::with_capacity(exprs.len());
        for e in exprs {
            let entry = match self.dim_of(rule, e) {
                Some(d) => Group::Dim(d),
                None if self.names_time_item(rule, e, ctx) => Group::Time,
                None => return None,
            };
            if !group.contains(&entry) {
                group.push(entry);
            }
        }
        Some(Some(group))
    }

    /// Whether a `GROUP BY` entry names the time series item: its alias, its
    /// position, or the same function of the time column.
    fn names_time_item(&self, rule: &RollupRule, e: &Expr, ctx: &PlanContext<'_>) -> bool {
        let Some((at, format)) = self.items.iter().enumerate().find_map(|(i, it)| match it {
            Item::Time { format, .. } => Some((i, *format)),
            _ => None,
        }) else {
            return false;
        };
        if let Expr::Identifier(id) = e {
            if let Item::Time { alias, .. } = &self.items[at] {
                if eq(&id.value, alias) && !eq(&id.value, &rule.time) {
                    return true;
                }
            }
        }
        if let Some(n) = ctx.literal(e).and_then(|l| l.as_i64()) {
            return usize::try_from(n).is_ok_and(|n| n == at + 1);
        }
        match (self.time_function(rule, e, ctx), format) {
            (Some(None), None) => true,
            (Some(Some(f)), Some(g)) => {
                let text = |x: &Expr| ctx.literal(x).map(|l| l.text.into_owned());
                text(f).is_some() && text(f) == text(g)
            }
            _ => false,
        }
    }

    /// Every grouped output column is grouped: a dimension or the time series in
    /// the select list is in `GROUP BY` (without `GROUP BY` none may be selected).
    fn grouped_items(&self) -> Option<()> {
        let group = self.group.as_deref().unwrap_or_default();
        for it in &self.items {
            let entry = match it {
                Item::Dim { dim, .. } => Group::Dim(*dim),
                Item::Time { .. } => Group::Time,
                Item::Agg { .. } => continue,
            };
            if !group.contains(&entry) {
                return None;
            }
        }
        // A time series grouped but not selected has no column to sort or show by.
        let selected = self.items.iter().any(|i| matches!(i, Item::Time { .. }));
        (!group.contains(&Group::Time) || selected).then_some(())
    }

    /// `DATE(time)` → `Some(None)`, `DATE_FORMAT(time, fmt)` with a format the
    /// rollup's buckets answer → `Some(Some(fmt))`.
    fn time_function(
        &self,
        rule: &RollupRule,
        e: &'q Expr,
        ctx: &PlanContext<'_>,
    ) -> Option<Option<&'q Expr>> {
        let Expr::Function(f) = e else {
            return None;
        };
        let [name] = f.name.0.as_slice() else {
            return None;
        };
        let name = name.as_ident()?.value.to_ascii_uppercase();
        let FunctionArguments::List(list) = &f.args else {
            return None;
        };
        let plain = f.over.is_none()
            && f.filter.is_none()
            && list.duplicate_treatment.is_none()
            && list.clauses.is_empty();
        let args: Vec<&Expr> = list
            .args
            .iter()
            .map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) => Some(x),
                _ => None,
            })
            .collect::<Option<_>>()?;
        let is_time = |x: &Expr| self.column_of(x).is_some_and(|c| eq(&c, &rule.time));
        match (name.as_str(), args.as_slice()) {
            ("DATE", [t]) if plain && is_time(t) => Some(None),
            ("DATE_FORMAT", [t, fmt]) if plain && is_time(t) => {
                let lit = ctx.literal(fmt)?;
                answerable_format(rule, &lit.text).then_some(Some(*fmt))
            }
            _ => None,
        }
    }

    fn projection(
        &mut self,
        rule: &RollupRule,
        items: &'q [SelectItem],
        ctx: &PlanContext<'_>,
    ) -> Option<()> {
        let mut names: Vec<String> = Vec::new();
        for (position, item) in items.iter().enumerate() {
            let (expr, alias) = match item {
                SelectItem::UnnamedExpr(e) => (e, None),
                SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.value.clone())),
                _ => return None,
            };
            let item = match (self.dim_of(rule, expr), alias) {
                (Some(dim), alias) => {
                    let name = alias.or_else(|| column_name(expr))?;
                    Item::Dim { dim, name }
                }
                (None, Some(alias)) => match self.time_function(rule, expr, ctx) {
                    Some(format) => {
                        if self.items.iter().any(|i| matches!(i, Item::Time { .. })) {
                            return None;
                        }
                        Item::Time { format, alias }
                    }
                    None => Item::Agg {
                        measure: aggregate(rule, self, expr)?,
                        alias,
                        name: None,
                    },
                },
                // An unaliased aggregate, named as spelt.
                (None, None) => {
                    let measure = aggregate(rule, self, expr)?;
                    Item::Agg {
                        measure,
                        alias: format!("hs_agg{position}"),
                        name: Some(ctx.spelt_item(position)?),
                    }
                }
            };
            let inner = match &item {
                Item::Dim { dim, .. } => rule.logical.key()[*dim].to_ascii_lowercase(),
                Item::Agg { alias, .. } | Item::Time { alias, .. } => alias.to_ascii_lowercase(),
            };
            let computed = !matches!(item, Item::Dim { .. });
            // Inner column names must not collide (a dimension twice is fine).
            let dup = names.contains(&inner);
            let own = matches!(item, Item::Agg { name: Some(_), .. });
            if dup && computed || (reserved(&inner) && !own) || eq(&inner, &rule.time) {
                return None;
            }
            if computed {
                let clash = self.items.iter().any(|i| match i {
                    Item::Dim { dim, .. } => eq(&rule.logical.key()[*dim], &inner),
                    _ => false,
                });
                let dim_clash = rule.logical.key().iter().any(|d| eq(d, &inner));
                if clash || dim_clash {
                    return None;
                }
            }
            names.push(inner);
            self.items.push(item);
        }
        (!self.items.is_empty()).then_some(())
    }

    fn predicates(&mut self, rule: &RollupRule, w: &'q Expr) -> Option<()> {
        let mut terms = Vec::new();
        conjuncts(w, &mut terms);
        for t in terms {
            self.predicate(rule, t)?;
        }
        Some(())
    }

    fn predicate(&mut self, rule: &RollupRule, t: &'q Expr) -> Option<()> {
        match t {
            Expr::BinaryOp { left, op, right } => {
                let time = |e: &Expr| self.column_of(e).is_some_and(|c| eq(&c, &rule.time));
                if time(left) && constant(right) {
                    return self.bound(op, right, false);
                }
                if time(right) && constant(left) {
                    return self.bound(op, left, true);
                }
                if *op != BinaryOperator::Eq {
                    return None;
                }
                let (col, value) = match (self.dim_of(rule, left), self.dim_of(rule, right)) {
                    (Some(d), None) if is_value(right) => (d, t),
                    (None, Some(d)) if is_value(left) => (d, t),
                    _ => return None,
                };
                self.filters.push(Filter::Value {
                    dim: col,
                    expr: value,
                    single: true,
                });
            }
            Expr::InList {
                expr,
                list,
                negated: false,
            } if list.iter().all(is_value) => {
                let dim = self.dim_of(rule, expr)?;
                self.filters.push(Filter::Value {
                    dim,
                    expr: t,
                    single: false,
                });
            }
            Expr::IsNull(e) => self.filters.push(Filter::IsNull(self.dim_of(rule, e)?)),
            Expr::IsNotNull(e) => self.filters.push(Filter::NotNull(self.dim_of(rule, e)?)),
            Expr::Between {
                expr,
                negated: false,
                low,
                high,
            } if self.column_of(expr).is_some_and(|c| eq(&c, &rule.time))
                && constant(low)
                && constant(high) =>
            {
                self.bound(&BinaryOperator::GtEq, low, false)?;
                self.bound(&BinaryOperator::LtEq, high, false)?;
            }
            _ => return None,
        }
        Some(())
    }

    /// Records `time <op> e` (`e <op> time` when `flipped`); one bound of each side.
    fn bound(&mut self, op: &BinaryOperator, e: &'q Expr, flipped: bool) -> Option<()> {
        use BinaryOperator::{Gt, GtEq, Lt, LtEq};
        let op = match (op, flipped) {
            (Gt, true) => Lt,
            (GtEq, true) => LtEq,
            (Lt, true) => Gt,
            (LtEq, true) => GtEq,
            (op, _) => op.clone(),
        };
        let (slot, strict) = match op {
            Gt => (&mut self.lower, true),
            GtEq => (&mut self.lower, false),
            Lt => (&mut self.upper, true),
            LtEq => (&mut self.upper, false),
            _ => return None,
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(Bound { expr: e, strict });
        Some(())
    }

    fn order_and_limit(&mut self, q: &Query) -> Option<()> {
        if let Some(o) = &q.order_by {
            let OrderByKind::Expressions(exprs) = &o.kind else {
                return None;
            };
            if o.interpolate.is_some() || exprs.is_empty() {
                return None;
            }
            for e in exprs {
                let plain = e.with_fill.is_none() && e.options.nulls_first.is_none();
                let output = match &e.expr {
                    Expr::Value(_) => true, // a position
                    // Not the proxy's own names: directly, they name no column.
                    other => self
                        .column_of(other)
                        .is_some_and(|c| !reserved(&c.to_ascii_lowercase())),
                };
                if !plain || !output {
                    return None;
                }
            }
            self.order_by = o.to_string();
        }
        if let Some(l) = &q.limit_clause {
            if let LimitClause::LimitOffset { limit_by, .. } = l {
                if !limit_by.is_empty() {
                    return None;
                }
            }
            self.limit = l.to_string();
        }
        Some(())
    }

    /// The statement that answers the read.
    fn sql(&self, rule: &RollupRule) -> String {
        let group: Vec<Group> = self.group.clone().unwrap_or_default();
        let inner = self.inner_sql(rule, &group, &self.measured());
        self.outer_sql(rule, &inner)
    }

    /// The statement around the grouping query `inner`: the output columns as
    /// the client named them, in the order MariaDB would return them.
    fn outer_sql(&self, rule: &RollupRule, inner: &str) -> String {
        let a = quote(&self.alias);
        let group: Vec<Group> = self.group.clone().unwrap_or_default();
        let dim = |d: usize| quote(&rule.logical.key()[d]);
        let outer_items: Vec<String> = self
            .items
            .iter()
            .map(|i| match i {
                Item::Dim { dim: d, name } => format!("{a}.{} AS {}", dim(*d), quote(name)),
                Item::Agg {
                    alias,
                    name: Some(name),
                    ..
                } => format!("{a}.{} AS {}", quote(alias), quote(name)),
                Item::Agg { alias, .. } => format!("{a}.{}", quote(alias)),
                Item::Time { format, alias } => format!(
                    "{} AS {}",
                    time_sql(&format!("{a}.`hs_t`"), *format),
                    quote(alias)
                ),
            })
            .collect();
        let order = if !self.order_by.is_empty() {
            format!(" {}", self.order_by)
        } else if !group.is_empty() {
            // MariaDB returns groups sorted by the GROUP BY columns.
            let cols: Vec<String> = group
                .iter()
                .map(|g| match g {
                    Group::Dim(d) => format!("{a}.{}", dim(*d)),
                    Group::Time => quote(&self.time_alias().unwrap_or_default()),
                })
                .collect();
            format!(" ORDER BY {}", cols.join(", "))
        } else {
            String::new()
        };
        let limit = if self.limit.is_empty() {
            String::new()
        } else {
            format!(" {}", self.limit)
        };
        format!(
            "SELECT {} FROM ({inner}) AS {a}{order}{limit}",
            outer_items.join(", ")
        )
    }

    /// The measured columns the read needs: (column, with its sum), each once;
    /// a `COUNT(col)` needs the column's count, a `SUM(col)` its count and sum.
    fn measured(&self) -> Vec<(&str, bool)> {
        let mut out: Vec<(&str, bool)> = Vec::new();
        for i in &self.items {
            let (c, sum) = match i {
                Item::Agg {
                    measure: Measure::Count(c),
                    ..
                } => (c.as_str(), false),
                Item::Agg {
                    measure: Measure::Sum(c),
                    ..
                } => (c.as_str(), true),
                _ => continue,
            };
            match out.iter_mut().find(|(o, _)| eq(o, c)) {
                Some(entry) => entry.1 |= sum,
                None => out.push((c, sum)),
            }
        }
        out
    }

    /// The time series item's alias, if the read has one.
    fn time_alias(&self) -> Option<String> {
        self.items.iter().find_map(|i| match i {
            Item::Time { alias, .. } => Some(alias.clone()),
            _ => None,
        })
    }

    /// The time series item's format (`None` for `DATE`), if the read has one.
    fn time_format(&self) -> Option<Option<&'q Expr>> {
        self.items.iter().find_map(|i| match i {
            Item::Time { format, .. } => Some(*format),
            _ => None,
        })
    }

    /// The grouping query over the rollup's and the log's rows.
    fn inner_sql(&self, rule: &RollupRule, group: &[Group], measured: &[(&str, bool)]) -> String {
        let own = Source {
            table: &rule.rollup_table,
            dims: rule.logical.key(),
        };
        let bucket = format!("{}.`hs_bucket`", quote(&self.alias));
        let range = self.within(&bucket, rule.bucket);
        let mut parts = vec![self.bucket_part(rule, &own, group, measured, &range, None)];
        if self.lower.is_some() || self.upper.is_some() {
            // The edges: whole finer buckets from a finer rollup when one can answer,
            // the rest from the log.
            let mut edge = rule.bucket;
            if let Some(tier) = self.tier(rule, group, measured) {
                let fine = Source {
                    table: &tier.table,
                    dims: &tier.dims,
                };
                let mut range = self.within(&bucket, tier.bucket);
                range.push(outside(
                    &bucket,
                    self.start(rule.bucket),
                    self.end(rule.bucket),
                ));
                parts.push(self.bucket_part(rule, &fine, group, measured, &range, None));
                edge = tier.bucket;
            }
            let a = quote(&self.alias);
            let t = format!("{a}.{}", quote(&rule.time));
            let edges = self.log_edges(&t, edge);
            let selection = self
                .selection
                .map_or_else(String::new, |w| format!("({w}) AND "));
            parts.push(self.log_part(rule, group, measured, &format!("{selection}{edges}"), None));
        }
        self.grouping_sql(rule, group, &parts)
    }

    /// The query grouping the rows of `parts` (a `UNION ALL` of rollup and log
    /// rows) by the read's groups.
    fn grouping_sql(&self, rule: &RollupRule, group: &[Group], parts: &[String]) -> String {
        let dim = |d: usize| quote(&rule.logical.key()[d]);
        let mut select: Vec<String> = Vec::new();
        let mut by: Vec<String> = Vec::new();
        for g in group {
            match g {
                Group::Dim(d) => {
                    select.push(format!("`hs_u`.{}", dim(*d)));
                    by.push(format!("`hs_u`.{}", dim(*d)));
                }
                Group::Time => {
                    // Any time of the group: the outer query applies the function.
                    select.push("MIN(`hs_u`.`hs_t`) AS `hs_t`".to_string());
                    by.push(time_sql("`hs_u`.`hs_t`", self.time_format().flatten()));
                }
            }
        }
        for i in &self.items {
            let Item::Agg { measure, alias, .. } = i else {
                continue;
            };
            let count = |column: &str| {
                format!("CAST(COALESCE(SUM(`hs_u`.{}), 0) AS SIGNED)", quote(column))
            };
            let value = match measure {
                Measure::Rows => count("hs_rows"),
                Measure::Count(c) => count(&format!("hs_count_{c}")),
                // NULL when the group has no value, as SUM over the log.
                Measure::Sum(c) => format!(
                    "IF(SUM(`hs_u`.{}) = 0, NULL, SUM(`hs_u`.{}))",
                    quote(&format!("hs_count_{c}")),
                    quote(&format!("hs_sum_{c}"))
                ),
            };
            select.push(format!("{value} AS {}", quote(alias)));
        }
        let mut sql = format!(
            "SELECT {} FROM ({}) AS `hs_u`",
            select.join(", "),
            parts.join(" UNION ALL ")
        );
        if !by.is_empty() {
            sql.push_str(&format!(
                " GROUP BY {} HAVING SUM(`hs_u`.`hs_rows`) > 0",
                by.join(", ")
            ));
        }
        sql
    }

    /// Whole buckets from a rollup table (the rule's own or a finer one's):
    /// `range` are the conditions on its `hs_bucket`.
    fn bucket_part(
        &self,
        rule: &RollupRule,
        src: &Source<'_>,
        group: &[Group],
        measured: &[(&str, bool)],
        range: &[String],
        sign: Option<&str>,
    ) -> String {
        let signed = |v: String| match sign {
            Some(s) => format!("({s}) * {v}"),
            None => v,
        };
        let a = quote(&self.alias);
        let bit = |d: usize| 1u64 << src.bit(&rule.logical.key()[d]);
        let mut cols: Vec<String> = group
            .iter()
            .map(|g| match g {
                Group::Dim(d) => {
                    let name = quote(&rule.logical.key()[*d]);
                    format!(
                        "IF(({a}.`hs_nulls` & {}) <> 0, NULL, {a}.{name}) AS {name}",
                        bit(*d)
                    )
                }
                Group::Time => format!(
                    "IF(({a}.`hs_nulls` & {TIME_NULL_BIT}) <> 0, NULL, {a}.`hs_bucket`) AS `hs_t`"
                ),
            })
            .collect();
        cols.push(format!("{} AS `hs_rows`", signed(format!("{a}.`hs_rows`"))));
        for (c, sum) in measured {
            let name = quote(&format!("hs_count_{c}"));
            cols.push(format!("{} AS {name}", signed(format!("{a}.{name}"))));
            if *sum {
                let name = quote(&format!("hs_sum_{c}"));
                cols.push(format!("{} AS {name}", signed(format!("{a}.{name}"))));
            }
        }
        let mut conds: Vec<String> = Vec::new();
        for f in &self.filters {
            let (dim, null) = match f {
                Filter::Value { dim, expr, .. } => {
                    conds.push(expr.to_string());
                    (*dim, false)
                }
                Filter::IsNull(dim) => (*dim, true),
                Filter::NotNull(dim) => (*dim, false),
            };
            let op = if null { "<>" } else { "=" };
            conds.push(format!("({a}.`hs_nulls` & {}) {op} 0", bit(dim)));
        }
        conds.extend(range.iter().cloned());
        if self.lower.is_some() || self.upper.is_some() {
            conds.push(format!("({a}.`hs_nulls` & {TIME_NULL_BIT}) = 0"));
        }
        let table = rule.logical.physical_sql(src.table, self.table);
        let mut sql = format!("SELECT {} FROM {table} AS {a}", cols.join(", "));
        if !conds.is_empty() {
            sql.push_str(&format!(" WHERE {}", conds.join(" AND ")));
        }
        sql
    }

    /// The ragged edges, from the log.
    /// `cond`: its WHERE clause; `sign`: a signed read's weight of each row and
    /// the scale of each summed column (its sums are then DECIMAL, so that an
    /// unsigned column can be subtracted).
    fn log_part(
        &self,
        rule: &RollupRule,
        group: &[Group],
        measured: &[(&str, bool)],
        cond: &str,
        sign: Option<(&str, &[ColumnDef])>,
    ) -> String {
        let a = quote(&self.alias);
        let t = format!("{a}.{}", quote(&rule.time));
        let mut cols: Vec<String> = group
            .iter()
            .map(|g| match g {
                Group::Dim(d) => {
                    let name = quote(&rule.logical.key()[*d]);
                    format!("{a}.{name} AS {name}")
                }
                Group::Time => format!("{t} AS `hs_t`"),
            })
            .collect();
        let weight = sign.map(|(s, _)| format!("({s})"));
        cols.push(format!("{} AS `hs_rows`", weight.as_deref().unwrap_or("1")));
        for (c, sum) in measured {
            let present = format!("({a}.{} IS NOT NULL)", quote(c));
            let count = match &weight {
                Some(w) => format!("{w} * {present}"),
                None => present,
            };
            cols.push(format!("{count} AS {}", quote(&format!("hs_count_{c}"))));
            if *sum {
                let value = match sign {
                    Some((s, meta)) => {
                        let scale = meta
                            .iter()
                            .find(|d| eq(&String::from_utf8_lossy(&d.org_name), c))
                            .map_or(0, |d| d.decimals);
                        format!("({s}) * CAST({a}.{} AS DECIMAL(65,{scale}))", quote(c))
                    }
                    None => format!("{a}.{}", quote(c)),
                };
                cols.push(format!("{value} AS {}", quote(&format!("hs_sum_{c}"))));
            }
        }
        format!(
            "SELECT {} FROM {} AS {a} WHERE {cond}",
            cols.join(", "),
            self.table
        )
    }

    /// The two-step form of a read with a time range (see [`Prelude`]): the query
    /// computing its bounds, and the read with those values as literals. `None` for
    /// a TIMESTAMP log (its UTC buckets are compared through the session's time
    /// zone) and for a read without a time range.
    ///
    /// With literal bounds the parts are signed instead of cut at the range's
    /// edges. For any `Dl` on the rollup's bucket grid, `Hl` on the finer one's and
    /// the range's lower bound `L`:
    ///
    /// `[t ≥ L] = [t ≥ Dl] + ([t ≥ Hl] − [t ≥ Dl]) + ([t ≥ L] − [t ≥ Hl])`
    ///
    /// and the same at the upper bound, so a row of the range is counted once
    /// whichever boundaries are picked: by the rollup between the two `D`s, plus or
    /// minus by the finer rollup between `Hl` and `Dl`, plus or minus by the log
    /// between `L` and `Hl`. The prelude picks each boundary nearest to its bound
    /// (the next one for an upper bound at or after `NOW()`, where the log has
    /// nothing yet), so the log is read for at most half a finer bucket at each
    /// edge (most often nothing after `NOW()`), where the one-step form reads
    /// a whole one. Two equal boundaries cancel whatever their value; where a level
    /// has no whole bucket between them, both are set to `L` so that nothing is read
    /// twice.
    fn prelude_sql(
        &self,
        rule: &RollupRule,
        meta: &[ColumnDef],
        ctx: &PlanContext<'_>,
    ) -> Option<(String, Arc<super::bounds::Bounds>, String)> {
        if self.utc || (self.lower.is_none() && self.upper.is_none()) {
            return None;
        }
        let group: Vec<Group> = self.group.clone().unwrap_or_default();
        let measured = self.measured();
        let tier = self.tier(rule, &group, &measured);
        // Coarsest first.
        let mut levels = vec![rule.bucket];
        levels.extend(tier.map(|t| t.bucket));
        // The literals, in the order `Bounds` gives them: the bounds, then each
        // level's boundaries.
        let mut next = 0u16;
        let mut mark = || {
            let m = ctx.computed(next).to_string();
            next += 1;
            m
        };
        let lv = self.lower.as_ref().map(|_| mark());
        let uv = self.upper.as_ref().map(|_| mark());
        let bounds: Vec<(Option<String>, Option<String>)> = levels
            .iter()
            .map(|_| (lv.as_ref().map(|_| mark()), uv.as_ref().map(|_| mark())))
            .collect();
        let dt = |b: &Bound<'_>| format!("CAST(({}) AS DATETIME(6))", b.expr);
        let mut cols: Vec<String> = [&self.lower, &self.upper]
            .into_iter()
            .flatten()
            .map(dt)
            .collect();
        if self.upper.is_some() {
            cols.push("NOW()".to_string());
        }
        let query = format!("SELECT {}", cols.join(", "));
        let values = Arc::new(super::bounds::Bounds {
            lower: self.lower.is_some(),
            upper: self.upper.is_some(),
            levels: levels.clone(),
        });

        let a = quote(&self.alias);
        let bucket = format!("{a}.`hs_bucket`");
        let t = format!("{a}.{}", quote(&rule.time));
        let mut parts = Vec::new();
        let (lower_strict, upper_strict) = (
            self.lower.as_ref().is_some_and(|b| b.strict),
            self.upper.as_ref().is_some_and(|b| b.strict),
        );
        // The rollup's own buckets: between the coarsest boundaries.
        let (dl, du) = bounds.first()?;
        let (range, sign) = match (dl, du) {
            (Some(l), Some(u)) => (
                format!("(({bucket} >= {l} AND {bucket} < {u}) OR ({bucket} >= {u} AND {bucket} < {l}))"),
                Some(format!("({bucket} >= {l}) - ({bucket} >= {u})")),
            ),
            (Some(l), None) => (format!("{bucket} >= {l}"), None),
            (None, Some(u)) => (format!("{bucket} < {u}"), None),
            (None, None) => return None,
        };
        let own = Source {
            table: &rule.rollup_table,
            dims: rule.logical.key(),
        };
        parts.push(self.bucket_part(rule, &own, &group, &measured, &[range], sign.as_deref()));
        // The rows between a level's boundaries `c` and the finer level's (or the
        // bounds) `f`, and their weight; `fine_strict`: the finer lower one counts
        // from `> f`, the finer upper one up to `< f` (a bound's strictness;
        // boundaries are (false, true)).
        let between = |col: &str,
                       (cl, cu): (&Option<String>, &Option<String>),
                       (fl, fu): (&Option<String>, &Option<String>),
                       fine_strict: (bool, bool)|
         -> (String, String) {
            let mut conds = Vec::new();
            let mut terms = Vec::new();
            if let (Some(c), Some(f)) = (cl, fl) {
                // [t ≥ f] − [t ≥ c] (or [t > f] at a strict lower bound).
                let (ge, lt) = if fine_strict.0 {
                    (">", "<=")
                } else {
                    (">=", "<")
                };
                conds.push(format!("({col} {ge} {f} AND {col} < {c})"));
                conds.push(format!("({col} >= {c} AND {col} {lt} {f})"));
                terms.push(format!("({col} {ge} {f}) - ({col} >= {c})"));
            }
            if let (Some(c), Some(f)) = (cu, fu) {
                // [t ≥ c] − [t > f] (or [t ≥ f] at a strict upper bound).
                let (gt, le) = if fine_strict.1 {
                    (">=", "<")
                } else {
                    (">", "<=")
                };
                conds.push(format!("({col} >= {c} AND {col} {le} {f})"));
                conds.push(format!("({col} {gt} {f} AND {col} < {c})"));
                terms.push(format!("({col} >= {c}) - ({col} {gt} {f})"));
            }
            (format!("({})", conds.join(" OR ")), terms.join(" + "))
        };
        if let (Some(tier), [c, f]) = (tier, bounds.as_slice()) {
            let fine = Source {
                table: &tier.table,
                dims: &tier.dims,
            };
            // Boundaries, not bounds: [t ≥ Hl] below, [t ≥ Hu] above.
            let (range, sign) = between(&bucket, (&c.0, &c.1), (&f.0, &f.1), (false, true));
            parts.push(self.bucket_part(rule, &fine, &group, &measured, &[range], Some(&sign)));
        }
        let finest = bounds.last()?;
        let (range, sign) = between(
            &t,
            (&finest.0, &finest.1),
            (&lv, &uv),
            (lower_strict, upper_strict),
        );
        let mut conds: Vec<String> = self
            .filters
            .iter()
            .map(|f| match f {
                Filter::Value { expr, .. } => expr.to_string(),
                Filter::IsNull(d) => format!("{a}.{} IS NULL", quote(&rule.logical.key()[*d])),
                Filter::NotNull(d) => format!("{a}.{} IS NOT NULL", quote(&rule.logical.key()[*d])),
            })
            .collect();
        conds.push(range);
        parts.push(self.log_part(
            rule,
            &group,
            &measured,
            &conds.join(" AND "),
            Some((&sign, meta)),
        ));
        let then = self.outer_sql(rule, &self.grouping_sql(rule, &group, &parts));
        Some((query, values, then))
    }

    /// The first bucket start inside the range's lower bound, as SQL.
    fn start(&self, bucket: Bucket) -> Option<String> {
        if self.utc {
            return Some(utc_bucket(&self.lower_secs(bucket)?));
        }
        let b = self.lower.as_ref()?;
        let floor = floor(bucket, b.expr);
        let next = format!("{floor} + INTERVAL 1 {}", bucket.unit());
        Some(if b.strict {
            format!("({next})")
        } else {
            format!("IF({floor} = ({}), {floor}, {next})", b.expr)
        })
    }

    /// The start of the bucket holding the range's upper bound, as SQL: buckets
    /// before it end at or before the bound.
    fn end(&self, bucket: Bucket) -> Option<String> {
        if self.utc {
            return Some(utc_bucket(&self.upper_secs(bucket)?));
        }
        Some(floor(bucket, self.upper.as_ref()?.expr))
    }

    /// For a TIMESTAMP log: the first UTC bucket start inside the lower bound, in
    /// seconds since the epoch (`UNIX_TIMESTAMP` converts the bound from the
    /// session's time zone as the comparison with the column does; NULL when it
    /// cannot).
    fn lower_secs(&self, bucket: Bucket) -> Option<String> {
        let b = self.lower.as_ref()?;
        let w = bucket.seconds();
        Some(if b.strict {
            format!("(FLOOR(UNIX_TIMESTAMP({}) / {w}) * {w} + {w})", b.expr)
        } else {
            format!("(CEILING(UNIX_TIMESTAMP({}) / {w}) * {w})", b.expr)
        })
    }

    /// For a TIMESTAMP log: the start of the UTC bucket holding the upper bound, in
    /// seconds since the epoch (NULL when the bound cannot be converted).
    fn upper_secs(&self, bucket: Bucket) -> Option<String> {
        let b = self.upper.as_ref()?;
        let w = bucket.seconds();
        Some(format!("(FLOOR(UNIX_TIMESTAMP({}) / {w}) * {w})", b.expr))
    }

    /// The log rows of the range outside the buckets `[start, end)` of width
    /// `edge` the rollups answer. A bound the server cannot turn into a bucket
    /// (NULL) leaves every row of the range to the log, as the rollups then answer
    /// none.
    fn log_edges(&self, t: &str, edge: Bucket) -> String {
        if !self.utc {
            let before = self
                .start(edge)
                .map(|s| format!("({t} < {s} OR {s} IS NULL)"));
            let after = self
                .end(edge)
                .map(|e| format!("({t} >= {e} OR {e} IS NULL)"));
            return either(before, after);
        }
        // A TIMESTAMP compared with a DATETIME is converted in the session's time
        // zone, which is ambiguous in the hour a clock goes back: the exact test is
        // on UNIX_TIMESTAMP, behind a range on the column widened by two hours so
        // that the log's index still narrows the read.
        let u = format!("UNIX_TIMESTAMP({t})");
        let before = self.lower_secs(edge).map(|s| {
            let s = format!("IFNULL({s}, {MAX_SECS})");
            format!("({t} <= FROM_UNIXTIME(LEAST({s} + 7200, 2147483647)) AND {u} < {s})")
        });
        let after = self.upper_secs(edge).map(|e| {
            let e = format!("IFNULL({e}, -1)");
            // The zero TIMESTAMP is in the rollup's first bucket, unless the upper
            // bound could not be converted.
            format!(
                "(({e} <= 7200 OR {t} >= FROM_UNIXTIME({e} - 7200)) AND IF({u} = 0, {e} < 0, {u} >= {e}))"
            )
        });
        either(before, after)
    }

    /// Conditions keeping the `bucket` column (qualified) to the whole buckets of
    /// width `width` inside the range.
    fn within(&self, bucket: &str, width: Bucket) -> Vec<String> {
        let mut range = Vec::new();
        if let Some(s) = self.start(width) {
            range.push(format!("{bucket} >= {s}"));
        }
        if let Some(e) = self.end(width) {
            range.push(format!("{bucket} < {e}"));
        }
        range
    }

    /// The finer rollup the edges of the range are read from: the one with the
    /// fewest dimensions that has every dimension the read filters or groups by and
    /// every measure it needs.
    fn tier<'r>(
        &self,
        rule: &'r RollupRule,
        group: &[Group],
        measured: &[(&str, bool)],
    ) -> Option<&'r Tier> {
        let mut dims: Vec<usize> = group
            .iter()
            .filter_map(|g| match g {
                Group::Dim(d) => Some(*d),
                Group::Time => None,
            })
            .collect();
        dims.extend(self.filters.iter().map(|f| match f {
            Filter::Value { dim, .. } | Filter::IsNull(dim) | Filter::NotNull(dim) => *dim,
        }));
        rule.finer
            .get()?
            .iter()
            .filter(|t| {
                dims.iter()
                    .all(|&d| t.dim(&rule.logical.key()[d]).is_some())
                    && measured.iter().all(|(c, sum)| t.measures(c, *sum))
            })
            .min_by_key(|t| (t.dims.len(), std::cmp::Reverse(t.bucket)))
    }

    /// Column definitions as the log's read would have them. Their flags depend on
    /// the plan MariaDB picks for the original read ([`Plan`]), which the rewrite
    /// predicts from the shape and the log's keys.
    fn patch(&self, rule: &RollupRule, meta: &[ColumnDef]) -> Option<ColumnPatch> {
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

    /// Whether every value a dimension is compared with is of the dimension's own
    /// kind: an integer literal for an integer column, a string literal for a
    /// string column (or a parameter). Another kind (`track_id = 2.4`,
    /// `country = 0`) is compared after a conversion whose result depends on the
    /// plan (MariaDB answers `track_id = 2.4` with the `track_id = 2` rows when it
    /// reads through an index) and may warn once per row compared: such reads go
    /// to the log.
    fn filters_compare_as_stored(
        &self,
        rule: &RollupRule,
        meta: &[ColumnDef],
        ctx: &PlanContext<'_>,
    ) -> bool {
        use crate::rewrite::{LiteralKind, Slot};
        for f in &self.filters {
            let Filter::Value { dim, expr, .. } = f else {
                continue;
            };
            let Some(col) = meta.iter().find(|d| {
                eq(
                    &String::from_utf8_lossy(&d.org_name),
                    &rule.logical.key()[*dim],
                )
            }) else {
                return false;
            };
            // Columns assumed without a database (`explain` alone) are of a type
            // nobody knows: either kind of literal is taken. (A real dimension is
            // never a VARCHAR primary key: the log's key is one integer column.)
            let assumed = {
                let key = crate::kinds::logical::assumed_column(
                    "",
                    "",
                    crate::kinds::logical::Assumed::Key,
                );
                (col.column_type, col.charset, col.length, col.flags)
                    == (key.column_type, key.charset, key.length, key.flags)
            };
            let integer = matches!(
                col.column_type,
                types::TINY | types::SHORT | types::INT24 | types::LONG | types::LONGLONG
            );
            // VARCHAR, VAR_STRING, STRING (CHAR, ENUM, SET).
            let string = matches!(col.column_type, 0x0f | 0xfd | 0xfe);
            let values: Vec<&Expr> = match expr {
                Expr::BinaryOp { left, right, .. } => {
                    if self.dim_of(rule, left).is_some() {
                        vec![right.as_ref()]
                    } else {
                        vec![left.as_ref()]
                    }
                }
                Expr::InList { list, .. } => list.iter().collect(),
                _ => return false,
            };
            for v in values {
                let mut v = v;
                let mut signed = false;
                loop {
                    match v {
                        Expr::Nested(inner) => v = inner,
                        Expr::UnaryOp {
                            op: UnaryOperator::Minus | UnaryOperator::Plus,
                            expr,
                        } if !signed => {
                            signed = true;
                            v = expr;
                        }
                        _ => break,
                    }
                }
                if matches!(ctx.slot(v), Some(Slot::Param(_))) && !signed {
                    continue;
                }
                let Some(lit) = ctx.literal(v) else {
                    return false;
                };
                let fits = if assumed {
                    lit.as_i64().is_some() || !signed && lit.kind == LiteralKind::String
                } else if integer {
                    lit.as_i64().is_some()
                } else {
                    string && !signed && lit.kind == LiteralKind::String
                };
                if !fits {
                    return false;
                }
            }
        }
        true
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

/// `CAST(DATE_FORMAT(e, '<bucket start>') AS DATETIME)`: the start of the bucket
/// holding `e`.
fn floor(bucket: Bucket, e: &Expr) -> String {
    format!(
        "CAST(DATE_FORMAT(({e}), '{}') AS DATETIME)",
        bucket.format()
    )
}

/// Seconds since the epoch of `9999-12-31 23:59:59` (after every TIMESTAMP).
const MAX_SECS: u64 = 253_402_300_799;

/// `'1970-01-01' + secs`: a UTC bucket start as the rollup stores it.
fn utc_bucket(secs: &str) -> String {
    format!("('1970-01-01 00:00:00' + INTERVAL {secs} SECOND)")
}

/// `t` outside `[start, end)` (either bound may be missing: then the other side
/// only).
fn outside(t: &str, start: Option<String>, end: Option<String>) -> String {
    either(
        start.map(|s| format!("{t} < {s}")),
        end.map(|e| format!("{t} >= {e}")),
    )
}

/// `a OR b` of the conditions present (`TRUE` when none is).
fn either(a: Option<String>, b: Option<String>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("({a} OR {b})"),
        (Some(a), None) => a,
        (None, Some(b)) => b,
        (None, None) => "TRUE".to_string(),
    }
}

/// A rollup table whole buckets are read from.
struct Source<'r> {
    /// The table as its rule names it.
    table: &'r TableName,
    /// Its dimensions in its order.
    dims: &'r [String],
}

impl Source<'_> {
    /// The `hs_nulls` bit of dimension `name` (one of the table's).
    fn bit(&self, name: &str) -> usize {
        self.dims
            .iter()
            .position(|d| d.eq_ignore_ascii_case(name))
            .unwrap_or(0)
    }
}

/// `DATE(t)`, or `DATE_FORMAT(t, fmt)` with the statement's format.
fn time_sql(t: &str, format: Option<&Expr>) -> String {
    match format {
        None => format!("DATE({t})"),
        Some(f) => format!("DATE_FORMAT({t}, {f})"),
    }
}

/// Whether `DATE_FORMAT(time, fmt)` has the same value for every time of one bucket:
/// the format (a plain quoted literal) uses only fields of the bucket's resolution or
/// coarser (`%Y-%m-%d` for days; also `%H` for hours).
fn answerable_format(rule: &RollupRule, literal: &[u8]) -> bool {
    let Some(inner) = literal
        .strip_prefix(b"'")
        .and_then(|l| l.strip_suffix(b"'"))
    else {
        return false;
    };
    if inner.contains(&b'\\') || inner.contains(&b'\'') {
        return false;
    }
    const DAY: &[u8] = b"YymcdejMbaWwDUuVvXx%";
    const HOUR: &[u8] = b"HkhIlp";
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        if b != b'%' {
            continue;
        }
        let Some(&spec) = bytes.next() else {
            return false;
        };
        let fits = DAY.contains(&spec)
            || (rule.bucket == super::spec::Bucket::Hour && HOUR.contains(&spec));
        if !fits {
            return false;
        }
    }
    true
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

/// Names the rewrite uses itself.
fn reserved(name: &str) -> bool {
    name.starts_with("hs_")
}

/// The log as the only FROM item: its name as written and the alias it is read
/// under.
fn source<'q>(
    rule: &RollupRule,
    from: &'q [TableWithJoins],
    ctx: &PlanContext<'_>,
) -> Option<(&'q ObjectName, String)> {
    let [TableWithJoins { relation, joins }] = from else {
        return None;
    };
    if !joins.is_empty() {
        return None;
    }
    let (name, alias) = crate::rewrite::shape::plain_table(relation)?;
    rule.logical.named_by(name, ctx).then_some((name, alias))
}

/// The measure an aggregate reads: `COUNT(*)`, or `COUNT(col)` of a column the
/// rollup counts.
fn aggregate(rule: &RollupRule, shape: &Shape<'_>, e: &Expr) -> Option<Measure> {
    let Expr::Function(f) = e else {
        return None;
    };
    let plain = !f.uses_odbc_syntax
        && matches!(f.parameters, FunctionArguments::None)
        && f.within_group.is_empty()
        && f.filter.is_none()
        && f.null_treatment.is_none()
        && f.over.is_none();
    let [name] = f.name.0.as_slice() else {
        return None;
    };
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let all = matches!(
        list.duplicate_treatment,
        None | Some(DuplicateTreatment::All)
    );
    let name = name.as_ident()?.value.to_ascii_lowercase();
    if !plain || !all || !list.clauses.is_empty() {
        return None;
    }
    match (name.as_str(), list.args.as_slice()) {
        ("count", [FunctionArg::Unnamed(FunctionArgExpr::Wildcard)]) => Some(Measure::Rows),
        (func @ ("count" | "sum"), [FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))]) => {
            let col = shape.column_of(arg)?;
            rule.measures.iter().find_map(|m| match (func, m) {
                // A column the rollup sums is also counted.
                ("count", Measure::Count(c) | Measure::Sum(c)) if eq(c, &col) => {
                    Some(Measure::Count(c.clone()))
                }
                ("sum", Measure::Sum(c)) if eq(c, &col) => Some(Measure::Sum(c.clone())),
                _ => None,
            })
        }
        _ => None,
    }
}

/// The server's clock functions: the same value for every row of a statement.
const NOW: &[&str] = &[
    "NOW",
    "CURRENT_TIMESTAMP",
    "LOCALTIME",
    "LOCALTIMESTAMP",
    "CURDATE",
    "CURRENT_DATE",
    "UTC_TIMESTAMP",
    "UTC_DATE",
];

/// Whether the server turns the time bound `e` into a valid DATETIME without a
/// warning in any sql_mode, so that the one-step form's boundary expressions
/// (`CAST(DATE_FORMAT(e, …) AS DATETIME)`, `+ INTERVAL 1 DAY`) are neither NULL
/// nor out of range: a `'YYYY-MM-DD[ HH:MM:SS[.f]]'` literal of a valid date in
/// the years 1000–9998, or `NOW()` and its kin (`CURDATE()`, `UTC_TIMESTAMP()`, …),
/// each under `DATE(…)` and `± INTERVAL n unit` with an integer literal `n`, all
/// intervals together at most 200 years (a literal then at least 200 years from
/// either end). Walked as a chain, without recursion.
fn plain_bound(e: &Expr, ctx: &PlanContext<'_>) -> bool {
    use sqlparser::ast::DateTimeField as F;
    const DAY: u64 = 86_400;
    const LIMIT: u64 = 200 * 365 * DAY;
    let mut e = e;
    let mut shift: u64 = 0;
    loop {
        match e {
            Expr::Nested(inner) => e = inner,
            Expr::BinaryOp {
                left,
                op: BinaryOperator::Plus | BinaryOperator::Minus,
                right,
            } => {
                let Expr::Interval(i) = right.as_ref() else {
                    return false;
                };
                if i.last_field.is_some()
                    || i.leading_precision.is_some()
                    || i.fractional_seconds_precision.is_some()
                {
                    return false;
                }
                let unit = match &i.leading_field {
                    Some(F::Second) => 1,
                    Some(F::Minute) => 60,
                    Some(F::Hour) => 3_600,
                    Some(F::Day) => DAY,
                    Some(F::Week(None)) => 7 * DAY,
                    Some(F::Month) => 31 * DAY,
                    Some(F::Quarter) => 92 * DAY,
                    Some(F::Year) => 366 * DAY,
                    _ => return false,
                };
                let Some(n) = ctx.literal(&i.value).and_then(|l| l.as_i64()) else {
                    return false;
                };
                shift = shift.saturating_add(n.unsigned_abs().saturating_mul(unit));
                if shift > LIMIT {
                    return false;
                }
                e = left;
            }
            Expr::Function(f) => {
                let [name] = f.name.0.as_slice() else {
                    return false;
                };
                let Some(name) = name.as_ident().map(|i| i.value.to_ascii_uppercase()) else {
                    return false;
                };
                if f.over.is_some() || f.filter.is_some() {
                    return false;
                }
                let args: Vec<&FunctionArg> = match &f.args {
                    FunctionArguments::None => Vec::new(),
                    FunctionArguments::List(l)
                        if l.duplicate_treatment.is_none() && l.clauses.is_empty() =>
                    {
                        l.args.iter().collect()
                    }
                    _ => return false,
                };
                fn arg<'x>(a: &&'x FunctionArg) -> Option<&'x Expr> {
                    match a {
                        FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) => Some(x),
                        _ => None,
                    }
                }
                match (name.as_str(), args.as_slice()) {
                    ("DATE", [a]) => match arg(a) {
                        Some(x) => e = x,
                        None => return false,
                    },
                    (n, []) if NOW.contains(&n) => return true,
                    (n, [a]) if NOW.contains(&n) => {
                        // The fractional-seconds precision.
                        return arg(a)
                            .and_then(|x| ctx.literal(x))
                            .and_then(|l| l.as_i64())
                            .is_some_and(|p| (0..=6).contains(&p));
                    }
                    _ => return false,
                }
            }
            _ => {
                let Some(lit) = ctx.literal(e) else {
                    return false;
                };
                let Some(inner) = lit
                    .text
                    .strip_prefix(b"'")
                    .and_then(|t| t.strip_suffix(b"'"))
                else {
                    return false;
                };
                let full = if inner.len() == 10 {
                    [inner, b" 00:00:00"].concat()
                } else {
                    inner.to_vec()
                };
                let Some(year) = super::bounds::valid_year(&full) else {
                    return false;
                };
                let margin = if shift == 0 { 1 } else { 201 };
                return (1000 + margin..=9999 - margin).contains(&year)
                    || (shift == 0 && year == 1000);
            }
        }
    }
}

/// An expression the server evaluates to the same value for every row of one
/// statement: literals, parameters, `NOW()`-like functions, intervals and
/// arithmetic over them. Walked with an explicit stack.
fn constant(e: &Expr) -> bool {
    const FUNCTIONS: &[&str] = &[
        "DATE",
        "TIMESTAMP",
        "DATE_SUB",
        "DATE_ADD",
        "SUBDATE",
        "ADDDATE",
        "FROM_UNIXTIME",
        "DATEDIFF",
    ];
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        match e {
            Expr::Value(_) | Expr::TypedString { .. } => {}
            Expr::Nested(inner) => stack.push(inner),
            Expr::UnaryOp { expr, .. } => stack.push(expr),
            Expr::Prefixed { value, .. } => stack.push(value),
            Expr::Interval(i) => stack.push(&i.value),
            Expr::Cast { expr, .. } => stack.push(expr),
            Expr::BinaryOp {
                left,
                op:
                    BinaryOperator::Plus
                    | BinaryOperator::Minus
                    | BinaryOperator::Multiply
                    | BinaryOperator::Divide,
                right,
            } => {
                stack.push(left);
                stack.push(right);
            }
            Expr::Function(f) => {
                let known = match f.name.0.as_slice() {
                    [n] => n.as_ident().is_some_and(|i| {
                        NOW.iter()
                            .chain(FUNCTIONS)
                            .any(|k| k.eq_ignore_ascii_case(&i.value))
                    }),
                    _ => false,
                };
                if !known || f.over.is_some() || f.filter.is_some() {
                    return false;
                }
                match &f.args {
                    FunctionArguments::None => {}
                    FunctionArguments::List(l) => {
                        for a in &l.args {
                            match a {
                                FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) => stack.push(x),
                                _ => return false,
                            }
                        }
                    }
                    FunctionArguments::Subquery(_) => return false,
                }
            }
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {

    use super::super::testutil::{engine_of, DAY_RULE};
    use crate::rewrite::testutil::{
        assert_fallbacks, assert_passthrough, assert_sql, decide, parsed, reject, rewrite,
    };
    use crate::rewrite::{Decision, Engine, Reply};

    /// An engine with a day rollup of `plays` by (track_id, country), and the log's
    /// columns known for database `shop`.
    fn engine() -> Engine {
        engine_with("")
    }

    fn engine_with(extra: &str) -> Engine {
        engine_of(&format!("{DAY_RULE}{extra}"))
    }

    const ROLLUP_COLS: &str = "IF((`p`.`hs_nulls` & 1) <> 0, NULL, `p`.`track_id`) AS `track_id`, IF((`p`.`hs_nulls` & 2) <> 0, NULL, `p`.`country`) AS `country`, `p`.`hs_rows` AS `hs_rows`";

    #[test]
    fn whole_buckets_from_the_rollup_edges_from_the_log() {
        let e = engine();
        let r = rewrite(
            &e,
            "SELECT track_id, country, COUNT(*) AS total FROM plays p WHERE track_id = 7 \
             AND created_at >= '2024-03-01 10:30:00' GROUP BY track_id, country",
        );
        let s = "IF(CAST(DATE_FORMAT(('2024-03-01 10:30:00'), '%Y-%m-%d 00:00:00') AS DATETIME) = ('2024-03-01 10:30:00'), \
                 CAST(DATE_FORMAT(('2024-03-01 10:30:00'), '%Y-%m-%d 00:00:00') AS DATETIME), \
                 CAST(DATE_FORMAT(('2024-03-01 10:30:00'), '%Y-%m-%d 00:00:00') AS DATETIME) + INTERVAL 1 DAY)";
        assert_sql(
            &r,
            &[&format!(
                "SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, `p`.`total` FROM (\
                 SELECT `hs_u`.`track_id`, `hs_u`.`country`, CAST(COALESCE(SUM(`hs_u`.`hs_rows`), 0) AS SIGNED) AS `total` FROM (\
                 SELECT {ROLLUP_COLS} FROM `plays_by_day` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 1) = 0 \
                 AND `p`.`hs_bucket` >= {s} AND (`p`.`hs_nulls` & 2147483648) = 0 \
                 UNION ALL SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, 1 AS `hs_rows` FROM plays AS `p` \
                 WHERE (track_id = 7 AND created_at >= '2024-03-01 10:30:00') AND (`p`.`created_at` < {s} OR {s} IS NULL)) AS `hs_u` \
                 GROUP BY `hs_u`.`track_id`, `hs_u`.`country` HAVING SUM(`hs_u`.`hs_rows`) > 0) AS `p` \
                 ORDER BY `p`.`track_id`, `p`.`country`"
            )],
        );
        let Reply::Patched(patch) = &r.reply else {
            panic!("{:?}", r.reply)
        };
        assert_eq!(patch.computed.len(), 3);
    }

    #[test]
    fn all_time_totals_read_the_rollup_alone() {
        let e = engine();
        let r = rewrite(&e, "SELECT COUNT(*) AS n FROM plays WHERE country IS NULL");
        assert_sql(
            &r,
            &["SELECT `plays`.`n` FROM (SELECT CAST(COALESCE(SUM(`hs_u`.`hs_rows`), 0) AS SIGNED) AS `n` \
               FROM (SELECT `plays`.`hs_rows` AS `hs_rows` FROM `plays_by_day` AS `plays` \
               WHERE (`plays`.`hs_nulls` & 2) <> 0) AS `hs_u`) AS `plays`"],
        );
    }

    #[test]
    fn other_reads_fall_back_and_writes_pass() {
        let e = engine();
        let fallbacks = [
            // A comment in an unaliased item: MariaDB names it without the comment.
            "SELECT COUNT(/* all */ *) FROM plays WHERE track_id = 1",
            "SELECT user_id, COUNT(*) AS n FROM plays GROUP BY user_id",
            "SELECT track_id, COUNT(*) AS n FROM plays GROUP BY track_id HAVING n > 1",
            "SELECT track_id, COUNT(*) AS n FROM plays WHERE created_at > RAND() GROUP BY track_id",
            "SELECT DATE_FORMAT(created_at, '%Y-%m-%d %H') AS h, COUNT(*) AS n FROM plays GROUP BY h",
        ];
        assert_fallbacks(&e, &fallbacks);
        let passed = [
            "SELECT * FROM plays WHERE id = 1",
            "INSERT INTO plays (track_id) VALUES (RAND())",
            "UPDATE plays SET country = 'x' WHERE id = 1",
            "DELETE FROM plays WHERE id = 1",
            // The parser cannot read these; the triggers keep the rollups anyway.
            "UPDATE LOW_PRIORITY plays SET country = 'x' WHERE id = 1",
            "DELETE QUICK FROM plays WHERE id = 1",
        ];
        assert_passthrough(&e, &passed);
        assert!(reject(&e, "TRUNCATE TABLE plays").contains("fires no trigger"));
        assert!(reject(&e, "ALTER TABLE plays ADD COLUMN x INT").contains("rollup"));
    }

    /// An unaliased aggregate is computed under the proxy's alias and named as the
    /// client spelt it; two spellings of one fingerprint get their own names (the
    /// plan is cached per spelling), and other literals share the spelling's plan.
    #[test]
    fn unaliased_aggregates_are_named_as_spelt() {
        use sqlparser::ast::{SelectItem, SetExpr, Statement};
        let e = engine();
        let outer_names = |sql: &str| -> Vec<String> {
            let rw = rewrite(&e, sql);
            let text = String::from_utf8(rw.statements[0].clone()).expect("utf-8");
            let stmt = crate::rewrite::parse_statements(&text)
                .expect("parses")
                .remove(0);
            let Statement::Query(q) = stmt else {
                panic!("{text}: not a query")
            };
            let SetExpr::Select(sel) = *q.body else {
                panic!("{text}: not a select")
            };
            sel.projection
                .iter()
                .map(|i| match i {
                    SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
                    other => other.to_string(),
                })
                .collect()
        };
        assert_eq!(
            outer_names("SELECT COUNT(*) FROM plays WHERE track_id = 1"),
            ["COUNT(*)"]
        );
        assert_eq!(
            outer_names("SELECT COUNT( *\n) FROM plays WHERE track_id = 2"),
            ["COUNT( *\n)"]
        );
        assert_eq!(
            outer_names("SELECT track_id, COUNT(*) AS n, count(*) FROM plays GROUP BY track_id"),
            ["track_id", "`plays`.`n`", "count(*)"]
        );
    }

    /// An hour rollup with the read's dimensions (in another order) gives the whole
    /// hours of the edges; the log only the partial hours.
    /// Text reads with a time range also carry the two-step form: the bounds
    /// computed first, then every part signed between literal boundaries.
    #[test]
    fn literal_bounds_sign_the_parts_between_boundaries() {
        use crate::rewrite::testutil::{decide_prepared, parsed};
        use crate::wire::resultset::types::DATETIME;
        let e = engine_of(&format!(
            "{DAY_RULE}[[rollup]]\nname = \"by_hour\"\ntable = \"plays\"\nrollup_table = \"plays_by_hour\"\n\
             time = \"created_at\"\nbucket = \"hour\"\ndimensions = [\"track_id\", \"country\"]\n"
        ));
        let sql = "SELECT track_id, country, COUNT(*) AS total FROM plays p WHERE track_id = 7 \
                   AND created_at BETWEEN NOW() - INTERVAL 7 DAY AND NOW() GROUP BY track_id, country";
        let rw = rewrite(&e, sql);
        let p = rw.prelude.as_deref().expect("a two-step form");
        assert_eq!(
            parsed(&[&p.query]),
            parsed(&["SELECT CAST((NOW() - INTERVAL 7 DAY) AS DATETIME(6)), CAST((NOW()) AS DATETIME(6)), NOW()"])
        );
        let row: [Option<&[u8]>; 3] = [
            Some(b"2026-11-19 18:24:13.000000"),
            Some(b"2026-11-26 18:24:13.000000"),
            Some(b"2026-11-26 18:24:13"),
        ];
        let got = p.statements_for(&row, &[DATETIME; 3]).expect("literals");
        let ts = |v: &str| format!("TIMESTAMP'{v}.000000'");
        let (l, u) = (ts("2026-11-19 18:24:13"), ts("2026-11-26 18:24:13"));
        let (dl, du, hl, hu) = (
            ts("2026-11-20 00:00:00"),
            ts("2026-11-27 00:00:00"),
            ts("2026-11-19 18:00:00"),
            ts("2026-11-26 19:00:00"),
        );
        let b = "`p`.`hs_bucket`";
        let t = "`p`.`created_at`";
        let signed =
            |w: &str| ROLLUP_COLS.replace("`p`.`hs_rows` AS", &format!("({w}) * `p`.`hs_rows` AS"));
        let expected = format!(
            "SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, `p`.`total` FROM (\
             SELECT `hs_u`.`track_id`, `hs_u`.`country`, CAST(COALESCE(SUM(`hs_u`.`hs_rows`), 0) AS SIGNED) AS `total` FROM (\
             SELECT {} FROM `plays_by_day` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 1) = 0 \
             AND (({b} >= {dl} AND {b} < {du}) OR ({b} >= {du} AND {b} < {dl})) AND (`p`.`hs_nulls` & 2147483648) = 0 \
             UNION ALL SELECT {} FROM `plays_by_hour` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 1) = 0 \
             AND (({b} >= {hl} AND {b} < {dl}) OR ({b} >= {dl} AND {b} < {hl}) \
                  OR ({b} >= {du} AND {b} < {hu}) OR ({b} >= {hu} AND {b} < {du})) \
             AND (`p`.`hs_nulls` & 2147483648) = 0 \
             UNION ALL SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, \
             (({t} >= {l}) - ({t} >= {hl}) + ({t} >= {hu}) - ({t} > {u})) AS `hs_rows` FROM plays AS `p` \
             WHERE track_id = 7 AND (({t} >= {l} AND {t} < {hl}) OR ({t} >= {hl} AND {t} < {l}) \
                  OR ({t} >= {hu} AND {t} <= {u}) OR ({t} > {u} AND {t} < {hu}))) AS `hs_u` \
             GROUP BY `hs_u`.`track_id`, `hs_u`.`country` HAVING SUM(`hs_u`.`hs_rows`) > 0) AS `p` \
             ORDER BY `p`.`track_id`, `p`.`country`",
            signed(&format!("({b} >= {dl}) - ({b} >= {du})")),
            signed(&format!("({b} >= {hl}) - ({b} >= {dl}) + ({b} >= {du}) - ({b} >= {hu})")),
        );
        assert_eq!(parsed(&got), parsed(&[&expected]));
        // A NULL bound, or another type, runs the one-step form.
        let null: [Option<&[u8]>; 3] = [None, row[1], row[2]];
        assert_eq!(p.statements_for(&null, &[DATETIME; 3]), None);
        // Prepared statements keep the one-step form.
        match decide_prepared(&e, sql) {
            Decision::Rewrite(r) => assert!(r.prelude.is_none()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn edges_from_a_finer_rollup() {
        let hour = |dims: &str, extra: &str| {
            engine_of(&format!(
                "{DAY_RULE}[[rollup]]\nname = \"by_hour\"\ntable = \"plays\"\nrollup_table = \"plays_by_hour\"\n\
                 time = \"created_at\"\nbucket = \"hour\"\ndimensions = [{dims}]\n{extra}"
            ))
        };
        let sql = "SELECT track_id, country, COUNT(*) AS total FROM plays p WHERE track_id = 7 \
                   AND created_at >= '2024-03-01 10:30:00' GROUP BY track_id, country";
        let lower = "'2024-03-01 10:30:00'";
        let ceil = |fmt: &str, unit: &str| {
            let f = format!("CAST(DATE_FORMAT(({lower}), '{fmt}') AS DATETIME)");
            format!("IF({f} = ({lower}), {f}, {f} + INTERVAL 1 {unit})")
        };
        let (s, sh) = (
            ceil("%Y-%m-%d 00:00:00", "DAY"),
            ceil("%Y-%m-%d %H:00:00", "HOUR"),
        );
        let hour_cols = "IF((`p`.`hs_nulls` & 2) <> 0, NULL, `p`.`track_id`) AS `track_id`, \
                         IF((`p`.`hs_nulls` & 1) <> 0, NULL, `p`.`country`) AS `country`, `p`.`hs_rows` AS `hs_rows`";
        let expected = format!(
            "SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, `p`.`total` FROM (\
             SELECT `hs_u`.`track_id`, `hs_u`.`country`, CAST(COALESCE(SUM(`hs_u`.`hs_rows`), 0) AS SIGNED) AS `total` FROM (\
             SELECT {ROLLUP_COLS} FROM `plays_by_day` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 1) = 0 \
             AND `p`.`hs_bucket` >= {s} AND (`p`.`hs_nulls` & 2147483648) = 0 \
             UNION ALL SELECT {hour_cols} FROM `plays_by_hour` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 2) = 0 \
             AND `p`.`hs_bucket` >= {sh} AND `p`.`hs_bucket` < {s} AND (`p`.`hs_nulls` & 2147483648) = 0 \
             UNION ALL SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, 1 AS `hs_rows` FROM plays AS `p` \
             WHERE (track_id = 7 AND created_at >= '2024-03-01 10:30:00') AND (`p`.`created_at` < {sh} OR {sh} IS NULL)) AS `hs_u` \
             GROUP BY `hs_u`.`track_id`, `hs_u`.`country` HAVING SUM(`hs_u`.`hs_rows`) > 0) AS `p` \
             ORDER BY `p`.`track_id`, `p`.`country`"
        );
        assert_sql(
            &rewrite(&hour("\"country\", \"track_id\"", ""), sql),
            &[&expected],
        );
        // Without a dimension the read needs, or in shadow mode, the hour rollup
        // takes no part: the edges come from the log.
        let alone = rewrite(&engine(), sql);
        for e in [
            hour("\"track_id\"", ""),
            hour("\"country\", \"track_id\"", "mode = \"shadow\"\n"),
        ] {
            assert_eq!(rewrite(&e, sql).statements, alone.statements);
        }
    }

    /// A TIMESTAMP log: UTC buckets from the bounds' `UNIX_TIMESTAMP`, the log's
    /// edges tested exactly on `UNIX_TIMESTAMP` behind a widened range; time series
    /// (days of the session's zone) fall back.
    #[test]
    fn timestamp_logs_have_utc_buckets() {
        let e = super::super::testutil::engine_with_time(
            DAY_RULE,
            crate::wire::resultset::types::TIMESTAMP,
        );
        let r = rewrite(
            &e,
            "SELECT track_id, country, COUNT(*) AS total FROM plays p WHERE track_id = 7 \
             AND created_at >= '2024-03-01 10:30:00' GROUP BY track_id, country",
        );
        let secs = "(CEILING(UNIX_TIMESTAMP('2024-03-01 10:30:00') / 86400) * 86400)";
        let s = format!("IFNULL({secs}, 253402300799)");
        assert_sql(
            &r,
            &[&format!(
                "SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, `p`.`total` FROM (\
                 SELECT `hs_u`.`track_id`, `hs_u`.`country`, CAST(COALESCE(SUM(`hs_u`.`hs_rows`), 0) AS SIGNED) AS `total` FROM (\
                 SELECT {ROLLUP_COLS} FROM `plays_by_day` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 1) = 0 \
                 AND `p`.`hs_bucket` >= ('1970-01-01 00:00:00' + INTERVAL {secs} SECOND) AND (`p`.`hs_nulls` & 2147483648) = 0 \
                 UNION ALL SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, 1 AS `hs_rows` FROM plays AS `p` \
                 WHERE (track_id = 7 AND created_at >= '2024-03-01 10:30:00') \
                 AND (`p`.`created_at` <= FROM_UNIXTIME(LEAST({s} + 7200, 2147483647)) AND UNIX_TIMESTAMP(`p`.`created_at`) < {s})) AS `hs_u` \
                 GROUP BY `hs_u`.`track_id`, `hs_u`.`country` HAVING SUM(`hs_u`.`hs_rows`) > 0) AS `p` \
                 ORDER BY `p`.`track_id`, `p`.`country`"
            )],
        );
        let series =
            "SELECT DATE(created_at) AS d, COUNT(*) AS n FROM plays WHERE track_id = 7 GROUP BY d";
        assert!(matches!(decide(&e, series), Decision::Fallback(_)));
    }

    /// Bounds whose one-step boundaries could be NULL (read differently by
    /// comparisons and `IS NULL` under NO_ZERO_DATE) or overflow with warnings:
    /// prepared reads fall back; text reads keep the two-step form and forward the
    /// statement as sent when the bounds' values decline it.
    #[test]
    fn bounds_the_one_step_form_cannot_take_exactly() {
        use crate::rewrite::testutil::decide_prepared;
        let e = engine();
        let read = |w: &str| format!("SELECT COUNT(*) AS n FROM plays WHERE track_id = 7 AND {w}");
        let fallback = [
            "created_at BETWEEN '0000-00-00' AND '2026-11-24'",
            "created_at >= 0",
            "created_at BETWEEN 0 AND NOW()",
            "created_at >= '9999-12-31 23:59:59'",
            "created_at >= '2024-02-30'",
            "created_at >= 20240301",
            "created_at >= ?",
            "created_at >= NOW() - INTERVAL (DATEDIFF(NOW(), '2024-03-15') * 24) HOUR",
            "created_at >= NOW() - INTERVAL 300 YEAR",
            "created_at >= '1100-01-01' - INTERVAL 1 DAY",
        ];
        for w in fallback {
            let sql = read(w);
            assert!(
                matches!(decide_prepared(&e, &sql), Decision::Fallback(_)),
                "{sql}"
            );
            if !w.contains('?') {
                let rw = rewrite(&e, &sql);
                let p = rw.prelude.as_deref().expect("a two-step form");
                assert!(p.original.is_some(), "{sql}");
            }
        }
        let rewritten = [
            "created_at BETWEEN '2024-03-01' AND '2024-03-09 10:30:00'",
            "created_at >= NOW() - INTERVAL 7 DAY",
            "created_at < DATE(UTC_TIMESTAMP(6)) + INTERVAL 1 MONTH",
            "created_at >= '2024-03-25 13:27:00' - INTERVAL 3 DAY",
            "created_at > CURDATE()",
        ];
        for w in rewritten {
            let sql = read(w);
            assert!(
                matches!(decide_prepared(&e, &sql), Decision::Rewrite(_)),
                "{sql}"
            );
        }
    }

    /// A dimension compared with a value of another kind is converted as the
    /// plan decides (`track_id = 2.4` through an index finds the `2` rows).
    #[test]
    fn values_of_another_kind_than_the_dimension_fall_back() {
        let e = engine();
        assert_fallbacks(
            &e,
            &[
                "SELECT COUNT(*) AS n FROM plays WHERE track_id = 2.4",
                "SELECT COUNT(*) AS n FROM plays WHERE track_id = '2'",
                "SELECT COUNT(*) AS n FROM plays WHERE track_id IN (1, 2e0)",
                "SELECT COUNT(*) AS n FROM plays WHERE country = 0",
                "SELECT COUNT(*) AS n FROM plays WHERE -country = 'x'",
            ],
        );
        for sql in [
            "SELECT COUNT(*) AS n FROM plays WHERE track_id = -2",
            "SELECT COUNT(*) AS n FROM plays WHERE track_id IN (1, 2) AND country = 'DE'",
        ] {
            assert!(matches!(decide(&e, sql), Decision::Rewrite(_)), "{sql}");
        }
    }

    #[test]
    fn shadow_mode_only_reports() {
        let e = engine_with("mode = \"shadow\"\n");
        let sql = "SELECT country, COUNT(*) AS n FROM plays WHERE track_id = 1 GROUP BY country";
        match decide(&e, sql) {
            Decision::Shadow(would) => assert!(matches!(*would, Decision::Rewrite(_))),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decide(&e, "TRUNCATE TABLE plays"),
            Decision::Shadow(_)
        ));
    }

    #[test]
    fn statements_the_parser_cannot_read_run_as_sent() {
        let e = engine();
        assert_fallbacks(
            &e,
            &[
                "LOAD DATA LOCAL INFILE 'plays.csv' INTO TABLE plays FIELDS TERMINATED BY ','",
                "LOAD DATA INFILE '/tmp/p' REPLACE INTO TABLE plays (created_at, track_id) SET country = 'US'",
                "SELECT COUNT(*) AS n FROM plays INTO @a",
                "SELECT track_id FROM plays INTO OUTFILE '/tmp/x'",
                "SELECT COUNT(*) AS n INTO @a FROM plays",
                "SET STATEMENT max_statement_time = 10 FOR SELECT COUNT(*) AS n FROM plays",
                "SET STATEMENT sql_mode = 'ANSI_QUOTES' FOR SELECT COUNT(*) AS n FROM plays",
            ],
        );
        // DDL the parser cannot read is still refused: no trigger follows it.
        let r = reject(&e, "ALTER TABLE plays TRUNCATE PARTITION p0");
        assert!(r.contains("cannot be parsed"), "{r}");
    }

    #[test]
    fn compound_interval_units_are_read() {
        let e = engine();
        let compound = "SELECT COUNT(*) AS n FROM plays WHERE created_at >= NOW() - INTERVAL '1:30' hour_minute \
                        AND created_at < DATE_ADD('2024-05-01', INTERVAL (1 + 1) DAY_HOUR)";
        // The standard spelling, which the parser reads (and MariaDB refuses): the
        // engine leaves it as written, so its rewrite is the reference.
        let standard = "SELECT COUNT(*) AS n FROM plays WHERE created_at >= NOW() - INTERVAL '1:30' HOUR TO MINUTE \
                        AND created_at < DATE_ADD('2024-05-01', INTERVAL (1 + 1) DAY TO HOUR)";
        let (r, want) = (rewrite(&e, compound), rewrite(&e, standard));
        // Every text of the rewrite has the units as MariaDB reads them; read with
        // the standard spelling, it is the reference rewrite.
        let standard_of = |text: &[u8]| {
            let text = String::from_utf8_lossy(text);
            assert!(!text.contains(" TO "), "{text}");
            text.replace("HOUR_MINUTE", "HOUR TO MINUTE")
                .replace("DAY_HOUR", "DAY TO HOUR")
        };
        let texts = |r: &crate::rewrite::Rewritten| -> Vec<Vec<u8>> {
            let p = r.prelude.as_deref().expect("a two-step form");
            let mut all = r.statements.clone();
            all.push(p.query.clone());
            all.extend(p.statements.iter().map(|(t, holes)| {
                // Holes (where the bounds go) become a literal, the same in both.
                let mut out = Vec::new();
                let mut at = 0;
                for &(offset, _) in holes {
                    out.extend_from_slice(&t[at..offset]);
                    out.extend_from_slice(b"'2024-05-01'");
                    at = offset;
                }
                out.extend_from_slice(&t[at..]);
                out
            }));
            all
        };
        let got: Vec<String> = texts(&r).iter().map(|t| standard_of(t)).collect();
        assert_eq!(parsed(&got), parsed(&texts(&want)));
        // Prepared reads have only the one-step form, which takes plain units only.
        assert!(matches!(
            crate::rewrite::testutil::decide_prepared(
                &e,
                "SELECT COUNT(*) AS n FROM plays WHERE created_at >= ? - INTERVAL '1:30' HOUR_MINUTE"
            ),
            Decision::Fallback(_)
        ));
    }

    #[test]
    fn set_statement_keeps_its_prefix_on_every_statement() {
        let e = engine();
        let read = "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id = 7 \
                    AND created_at >= '2024-03-01 10:30:00' GROUP BY track_id";
        let plain = rewrite(&e, read);
        let prefixed = rewrite(
            &e,
            &format!("SET STATEMENT time_zone = '+10:00', div_precision_increment = 6 FOR {read}"),
        );
        let prefix: &[u8] = b"SET STATEMENT time_zone = '+10:00', div_precision_increment = 6 FOR ";
        let rest = |texts: &[Vec<u8>]| -> Vec<Vec<u8>> {
            texts
                .iter()
                .map(|t| {
                    assert!(t.starts_with(prefix), "{}", String::from_utf8_lossy(t));
                    t[prefix.len()..].to_vec()
                })
                .collect()
        };
        assert_eq!(
            parsed(&rest(&prefixed.statements)),
            parsed(&plain.statements)
        );
        let (pa, pb) = (
            plain.prelude.as_deref().expect("a two-step form"),
            prefixed.prelude.as_deref().expect("a two-step form"),
        );
        assert_eq!(
            parsed(&rest(std::slice::from_ref(&pb.query))),
            parsed(&[&pa.query])
        );
        // The holes moved with the text: the same literals land in the same places.
        // (The read has a lower bound only: the row is that bound.)
        let row: [Option<&[u8]>; 1] = [Some(b"2024-03-01 10:30:00.000000")];
        let types = [0x0c];
        let sa = pa.statements_for(&row, &types).expect("the row's literals");
        let sb = pb.statements_for(&row, &types).expect("the row's literals");
        assert_eq!(parsed(&rest(&sb)), parsed(&sa));
        assert!(pb
            .original
            .as_deref()
            .is_some_and(|o| o.starts_with(b"SET STATEMENT time_zone")));
    }
}
