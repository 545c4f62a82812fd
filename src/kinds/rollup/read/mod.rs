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
//!
//! The module by concern: [`plan_read`] here takes a read from its statement to its
//! plan through the three steps, each in its own file —
//!
//! - `recognise.rs`: whether the statement is a read the rollup answers, taken
//!   apart into a [`Shape`] (output columns, groups, dimension filters, time
//!   bounds, order and limit), and the checks on the values it compares with;
//! - `render.rs`: the SQL built over the rollups and the log that answers it, in
//!   the one-step form and the two-step form with a prelude;
//! - `columns.rs`: the column definitions the client sees (names, types, flags),
//!   as the original read of the log would give them.

mod columns;
mod recognise;
mod render;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use sqlparser::ast::{Expr, GroupByExpr, ObjectName, Query, SelectItem, SetExpr};

use super::rule::RollupRule;
use super::spec::Measure;
use crate::rewrite::shape::eq;
use crate::rewrite::{parse_statements, Plan, PlanContext, Prelude, Refusal, Reply};
use crate::wire::resultset::types;
use recognise::plain_bound;

/// Why a read that aggregates the log in a shape no rollup of the rule answers
/// falls back.
const SHAPE_NOT_ANSWERED: &str =
    "the rollup cannot answer this read's shape: its groups, aggregates, filters or clauses";

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
    if !shape.settle_in_lists(ctx) {
        return Ok(Some(Plan::fallback(
            "an IN list's values may be equal to each other, which changes the column flags",
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
    // A prepared read's bound may be a parameter: its value is checked at each
    // execute, and one the form does not take runs the statement as sent.
    let one_step_only = ctx.prepared || shape.utc;
    let mut param_checks = Vec::new();
    if one_step_only
        && [&shape.lower, &shape.upper]
            .into_iter()
            .flatten()
            .any(|b| !plain_bound(b.expr, ctx, &mut param_checks))
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
    let cannot_patch = || {
        Plan::fallback(
            "the rollup cannot give the read's column definitions exactly as the log's read would",
        )
    };
    let Some(patch) = shape.patch(rule, &meta) else {
        return Ok(Some(cannot_patch()));
    };
    // Column flags the shape does not settle are the server's plan's (unless the
    // rule keeps the prediction: `exact_flags = false`). Without a prelude (the
    // one-step form only) nothing checks a range for emptiness before the read, and
    // an empty one is an "Impossible WHERE" answered with the table's flags: such a
    // ranged read asks the server's plan whatever its shape.
    let plan_flags = match rule.exact_flags {
        true => match shape.flags_by_plan(rule, &meta, one_step_only) {
            Some(f) => f.map(|f| Arc::new(f) as Arc<dyn crate::rewrite::PlanFlags>),
            None => return Ok(Some(cannot_patch())),
        },
        false => None,
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
        param_checks,
        plan_flags,
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

/// How two literals of an `IN` list compare, as far as the text tells.
#[derive(PartialEq, Eq)]
enum Same {
    Equal,
    Distinct,
    Unknown,
}

/// Two literals of an `IN` list: integers by value, strings of plain ASCII letters,
/// digits, spaces, `_` and `-` (quoted, or with an `N` introducer) by their text —
/// equal when identical, distinct when they differ in more than case and trailing
/// spaces (which a collation may ignore). Anything else is unknown.
fn same(a: &crate::rewrite::Literal<'_>, b: &crate::rewrite::Literal<'_>) -> Same {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return if x == y { Same::Equal } else { Same::Distinct };
    }
    let plain = |l: &crate::rewrite::Literal<'_>| -> Option<Vec<u8>> {
        if l.kind != crate::rewrite::LiteralKind::String {
            return None;
        }
        let t: &[u8] = &l.text;
        let t = t
            .strip_prefix(b"N")
            .or_else(|| t.strip_prefix(b"n"))
            .unwrap_or(t);
        let inner = match t {
            [b'\'', inner @ .., b'\''] | [b'"', inner @ .., b'"'] => inner,
            _ => return None,
        };
        inner
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b' ' | b'_' | b'-'))
            .then(|| inner.to_vec())
    };
    let (Some(x), Some(y)) = (plain(a), plain(b)) else {
        return Same::Unknown;
    };
    let folded = |v: &[u8]| {
        let mut v = v.to_ascii_lowercase();
        while v.last() == Some(&b' ') {
            v.pop();
        }
        v
    };
    if x == y {
        Same::Equal
    } else if folded(&x) != folded(&y) {
        Same::Distinct
    } else {
        Same::Unknown
    }
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
    /// Marks each `IN` list of one value (`country IN ('US', 'US')`) as fixing its
    /// dimension, as MariaDB reads it (no group flag on the column); `false` when
    /// the text cannot tell whether its values are equal (a parameter, literals of
    /// other kinds or that a collation may equate). Reads the literals' values: the
    /// plan is cached per value.
    fn settle_in_lists(&mut self, ctx: &PlanContext<'_>) -> bool {
        for f in &mut self.filters {
            let Filter::Value {
                expr: Expr::InList { list, .. },
                single,
                ..
            } = f
            else {
                continue;
            };
            if list.len() < 2 {
                *single = true;
                continue;
            }
            let mut values = Vec::with_capacity(list.len());
            for v in list.iter() {
                let mut v = v;
                while let Expr::Nested(inner) = v {
                    v = inner;
                }
                match ctx.literal(v) {
                    Some(l) => values.push(l),
                    None => return false,
                }
            }
            let mut all_equal = true;
            for (i, a) in values.iter().enumerate() {
                for b in &values[i + 1..] {
                    match same(a, b) {
                        Same::Equal => {}
                        Same::Distinct => all_equal = false,
                        Same::Unknown => return false,
                    }
                }
            }
            *single = all_equal;
        }
        true
    }

    /// The dimension `e` names (unqualified, or qualified by the statement's alias).
    fn dim_of(&self, rule: &RollupRule, e: &Expr) -> Option<usize> {
        let name = self.column_of(e)?;
        rule.logical.key().iter().position(|d| eq(d, &name))
    }

    /// The column `e` names, if it is a column of the log as the statement reads it.
    fn column_of(&self, mut e: &Expr) -> Option<String> {
        // Parentheses are unwrapped in a loop: their depth is the client's.
        while let Expr::Nested(inner) = e {
            e = inner;
        }
        match e {
            Expr::Identifier(i) => Some(i.value.clone()),
            Expr::CompoundIdentifier(p) if p.len() == 2 && eq(&p[0].value, &self.alias) => {
                Some(p[1].value.clone())
            }
            _ => None,
        }
    }

    /// The time series item's alias, if the read has one.
    fn time_alias(&self) -> Option<String> {
        self.items.iter().find_map(|i| match i {
            Item::Time { alias, .. } => Some(alias.clone()),
            _ => None,
        })
    }
}
