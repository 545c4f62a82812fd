//! Recognising a read the rollup answers: taking the statement apart into a
//! [`Shape`] (its output columns, groups, dimension filters, time bounds, order
//! and limit), and the checks on the values it compares with.

use sqlparser::ast::{
    BinaryOperator, DuplicateTreatment, Expr, FunctionArg, FunctionArgExpr, FunctionArguments,
    GroupByExpr, LimitClause, ObjectName, OrderByKind, Query, SelectItem, TableWithJoins,
    UnaryOperator,
};

use super::{Bound, Filter, Group, Item, Shape};
use crate::kinds::rollup::rule::RollupRule;
use crate::kinds::rollup::spec::{Bucket, Measure};
use crate::rewrite::shape::{column_name, conjuncts, eq, is_value};
use crate::rewrite::{ParamCheck, PlanContext, Slot};
use crate::wire::resultset::{types, ColumnDef};

impl<'q> Shape<'q> {
    /// Takes `q` apart, or `None` when it has any other shape.
    pub(super) fn of(rule: &RollupRule, q: &'q Query, ctx: &PlanContext<'_>) -> Option<Shape<'q>> {
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

    /// The select list: dimensions, aggregates and the time series, each output
    /// column's name free of clashes with the rewrite's own inner names.
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

    /// The WHERE clause, conjunct by conjunct.
    fn predicates(&mut self, rule: &RollupRule, w: &'q Expr) -> Option<()> {
        let mut terms = Vec::new();
        conjuncts(w, &mut terms);
        for t in terms {
            self.predicate(rule, t)?;
        }
        Some(())
    }

    /// One conjunct: a bound of the time range, or a filter on a dimension.
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

    /// `ORDER BY` over output columns (by name or position) and `LIMIT`, kept as
    /// written.
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

    /// Whether every value a dimension is compared with is of the dimension's own
    /// kind: an integer literal for an integer column, a string literal for a
    /// string column (or a parameter). Another kind (`track_id = 2.4`,
    /// `country = 0`) is compared after a conversion whose result depends on the
    /// plan (MariaDB answers `track_id = 2.4` with the `track_id = 2` rows when it
    /// reads through an index) and may warn once per row compared: such reads go
    /// to the log.
    pub(super) fn filters_compare_as_stored(
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
        let fits = DAY.contains(&spec) || (rule.bucket == Bucket::Hour && HOUR.contains(&spec));
        if !fits {
            return false;
        }
    }
    true
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
/// each under `DATE(…)` and `± INTERVAL n unit` with an integer literal `n` or a
/// compound unit's literal (`'1 2' DAY_HOUR`), all intervals together at most 200
/// years (a literal then at least 200 years from either end). A parameter in the
/// literal's place is taken with a check of its value at each execute, pushed on
/// `checks` ([`ParamCheck::Datetime`]: a value outside those years or of another
/// kind runs the statement as sent). Walked as a chain, without recursion.
pub(super) fn plain_bound(
    e: &Expr,
    ctx: &PlanContext<'_>,
    checks: &mut Vec<(usize, ParamCheck)>,
) -> bool {
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
                if i.leading_precision.is_some() || i.fractional_seconds_precision.is_some() {
                    return false;
                }
                let compound = i.last_field.is_some();
                if compound
                    && !matches!(
                        i.leading_field,
                        Some(F::Year | F::Day | F::Hour | F::Minute | F::Second)
                    )
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
                let n = if compound {
                    ctx.literal(&i.value)
                        .and_then(|l| compound_magnitude(&l.text))
                } else {
                    ctx.literal(&i.value)
                        .and_then(|l| l.as_i64())
                        .map(i64::unsigned_abs)
                };
                let Some(n) = n else {
                    return false;
                };
                shift = shift.saturating_add(n.saturating_mul(unit));
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
                let (min_year, max_year) = if shift == 0 {
                    (1000, 9998)
                } else {
                    (1201, 9798)
                };
                if let Some(Slot::Param(j)) = ctx.slot(e) {
                    checks.push((j, ParamCheck::Datetime { min_year, max_year }));
                    return true;
                }
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
                let Some(year) = crate::kinds::rollup::bounds::valid_year(&full) else {
                    return false;
                };
                return (i64::from(min_year)..=i64::from(max_year)).contains(&year);
            }
        }
    }
}

/// A bound on the seconds, in the compound unit's leading unit, of a compound
/// interval's literal (`'1 2'` of `DAY_HOUR`, `'1:30'` of `HOUR_MINUTE`, `1.5`):
/// each component counts in the leading unit or a finer one, so the sum of the
/// literal's numbers bounds it. `None` for text with letters (`1e3`, `0x10`), more
/// numbers than any unit has, or none.
fn compound_magnitude(text: &[u8]) -> Option<u64> {
    let inner = match text {
        [b'\'', inner @ .., b'\''] => inner,
        _ => text,
    };
    if inner
        .iter()
        .any(|&b| b.is_ascii_alphabetic() || b == b'\'' || b == b'\\' || !b.is_ascii())
    {
        return None;
    }
    let mut runs = 0usize;
    let mut sum: u64 = 0;
    for run in inner
        .split(|b| !b.is_ascii_digit())
        .filter(|r| !r.is_empty())
    {
        runs += 1;
        if run.len() > 18 {
            return None;
        }
        let n: u64 = std::str::from_utf8(run).ok()?.parse().ok()?;
        sum = sum.saturating_add(n);
    }
    (1..=5).contains(&runs).then_some(sum)
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
