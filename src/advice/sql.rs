//! Reading statement shapes: the parts of a parsed `digest_text` (or a sampled
//! statement) the detectors look at. Every walk here is a loop or a bounded
//! visitor: the parser bounds nesting (its recursion limit), and AND chains are
//! split with an explicit stack.

use std::ops::ControlFlow;

use sqlparser::ast::{
    visit_relations, BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments,
    GroupByExpr, LimitClause, ObjectName, OrderByExpr, OrderByKind, OrderBySort, Query, Select,
    SetExpr, Statement, TableFactor, TableWithJoins, UnaryOperator, Value, Visit, Visitor,
};

/// Parses one statement shape. `digest_text` holds `?` for literals and `(...)` for
/// collapsed lists (`IN (...)`, further `VALUES` rows), which become `(?)`; MariaDB's
/// performance_schema writes a collapsed list as `?, ...` (made `?`) and interval
/// units as `SQL_TSI_DAY` (made `DAY`).
pub fn parse_digest(text: &str) -> Option<Statement> {
    let text = text
        .replace("(...)", "(?)")
        .replace(", ...", "")
        .replace("SQL_TSI_", "");
    let mut v = crate::rewrite::parse_statements(&text).ok()?;
    (v.len() == 1).then(|| v.pop()).flatten()
}

/// `db.t` or `t`, as written (without quotes).
pub fn name(o: &ObjectName) -> String {
    o.0.iter()
        .map(|p| p.as_ident().map(|i| i.value.clone()).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(".")
}

/// The last part of a name (`db.t` → `t`).
pub fn last(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// Every table a statement names, as written, once each (subqueries included).
pub fn tables(stmt: &Statement) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let _ = visit_relations(stmt, |o| {
        let n = name(o);
        if !out.iter().any(|x| x.eq_ignore_ascii_case(&n)) {
            out.push(n);
        }
        ControlFlow::<()>::Continue(())
    });
    out
}

/// Every query inside a statement (the statement's own, subqueries, derived
/// tables), outermost first.
pub fn queries(stmt: &Statement) -> Vec<Query> {
    struct Q(Vec<Query>);
    impl Visitor for Q {
        type Break = ();
        fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
            self.0.push(q.clone());
            ControlFlow::Continue(())
        }
    }
    let mut q = Q(Vec::new());
    let _ = stmt.visit(&mut q);
    q.0
}

/// The terms of an AND chain (`a AND (b AND c)` → a, b, c), parentheses dropped.
pub fn conjuncts(e: &Expr) -> Vec<&Expr> {
    let mut out = Vec::new();
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        match e {
            Expr::Nested(inner) => stack.push(inner),
            Expr::BinaryOp {
                left,
                op: BinaryOperator::And,
                right,
            } => {
                stack.push(right);
                stack.push(left);
            }
            other => out.push(other),
        }
    }
    out
}

/// A column reference: (qualifier, column).
pub fn column(e: &Expr) -> Option<(Option<String>, String)> {
    match e {
        Expr::Nested(inner) => match inner.as_ref() {
            Expr::Identifier(i) => Some((None, i.value.clone())),
            Expr::CompoundIdentifier(_) => column(inner),
            _ => None,
        },
        Expr::Identifier(i) => Some((None, i.value.clone())),
        Expr::CompoundIdentifier(parts) if parts.len() >= 2 => {
            let col = parts.last()?.value.clone();
            let q = parts[parts.len() - 2].value.clone();
            Some((Some(q), col))
        }
        _ => None,
    }
}

/// A literal or a `?`.
pub fn is_value(e: &Expr) -> bool {
    match e {
        Expr::Value(_) => true,
        Expr::UnaryOp {
            op: UnaryOperator::Minus | UnaryOperator::Plus,
            expr,
        } => matches!(expr.as_ref(), Expr::Value(_)),
        Expr::Nested(inner) => matches!(inner.as_ref(), Expr::Value(_)),
        _ => false,
    }
}

/// A literal's text: strings without their quotes, numbers as written; `None` for
/// `?` and non-literals.
pub fn literal(e: &Expr) -> Option<String> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Placeholder(_) | Value::Null => None,
            Value::Number(n, _) => Some(n.clone()),
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => Some(s.clone()),
            other => Some(other.to_string()),
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => literal(expr).map(|l| format!("-{l}")),
        Expr::Nested(inner) => literal(inner),
        _ => None,
    }
}

/// An integer literal's value.
pub fn integer(e: &Expr) -> Option<u64> {
    literal(e)?.parse().ok()
}

/// `col = value` or `value = col`: the column and the value.
pub fn equality(e: &Expr) -> Option<((Option<String>, String), &Expr)> {
    let Expr::BinaryOp {
        left,
        op: BinaryOperator::Eq,
        right,
    } = e
    else {
        return None;
    };
    if let (Some(c), true) = (column(left), is_value(right)) {
        return Some((c, right));
    }
    if let (Some(c), true) = (column(right), is_value(left)) {
        return Some((c, left));
    }
    None
}

/// The columns a WHERE compares with a value (`a = ? AND b = ?` → a, b).
pub fn equality_columns(e: &Expr) -> Vec<(Option<String>, String)> {
    conjuncts(e)
        .into_iter()
        .filter_map(|c| equality(c).map(|(col, _)| col))
        .collect()
}

/// The WHERE of a statement's own top level (SELECT, UPDATE or DELETE).
pub fn where_of(stmt: &Statement) -> Option<&Expr> {
    match stmt {
        Statement::Query(q) => select_of(q)?.selection.as_ref(),
        Statement::Update(u) => u.selection.as_ref(),
        Statement::Delete(d) => d.selection.as_ref(),
        _ => None,
    }
}

/// The plain SELECT of a query (no set operation).
pub fn select_of(q: &Query) -> Option<&Select> {
    match q.body.as_ref() {
        SetExpr::Select(s) => Some(s),
        _ => None,
    }
}

/// The first `column = literal` of a statement's WHERE, as `hot_keys` reports it:
/// (column, literal text).
pub fn first_equality_literal(stmt: &Statement) -> Option<(String, String)> {
    conjuncts(where_of(stmt)?).into_iter().find_map(|c| {
        let ((_, col), v) = equality(c)?;
        Some((col, literal(v)?))
    })
}

/// The ORDER BY items of a query.
pub fn order_by(q: &Query) -> Vec<&OrderByExpr> {
    match q.order_by.as_ref().map(|o| &o.kind) {
        Some(OrderByKind::Expressions(v)) => v.iter().collect(),
        _ => Vec::new(),
    }
}

/// Whether an ORDER BY item is descending.
pub fn descending(o: &OrderByExpr) -> bool {
    matches!(o.options.sort, Some(OrderBySort::Desc))
}

/// A query's LIMIT and OFFSET expressions.
pub fn limit_offset(q: &Query) -> (Option<&Expr>, Option<&Expr>) {
    match &q.limit_clause {
        Some(LimitClause::LimitOffset { limit, offset, .. }) => {
            (limit.as_ref(), offset.as_ref().map(|o| &o.value))
        }
        Some(LimitClause::OffsetCommaLimit { offset, limit }) => (Some(limit), Some(offset)),
        None => (None, None),
    }
}

/// The tables of a FROM list and their aliases: (name as written, alias).
pub fn from_tables(from: &[TableWithJoins]) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for t in from {
        for f in std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)) {
            if let TableFactor::Table { name: n, alias, .. } = f {
                out.push((name(n), alias.as_ref().map(|a| a.name.value.clone())));
            }
        }
    }
    out
}

/// Whether FROM holds derived tables or table functions (not only named tables).
pub fn has_derived(from: &[TableWithJoins]) -> bool {
    from.iter().any(|t| {
        std::iter::once(&t.relation)
            .chain(t.joins.iter().map(|j| &j.relation))
            .any(|f| !matches!(f, TableFactor::Table { .. }))
    })
}

/// An aggregate call: (function name upper case, argument: `*` or a column).
pub fn aggregate(e: &Expr) -> Option<(String, String)> {
    let Expr::Function(f) = e else { return None };
    let fname = name(&f.name).to_ascii_uppercase();
    if !matches!(fname.as_str(), "COUNT" | "SUM" | "MIN" | "MAX" | "AVG") {
        return None;
    }
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    if list.duplicate_treatment.is_some() || list.args.len() != 1 {
        return None;
    }
    let arg = match &list.args[0] {
        FunctionArg::Unnamed(FunctionArgExpr::Wildcard) => "*".to_string(),
        FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) => column(x)?.1,
        _ => return None,
    };
    Some((fname, arg))
}

/// The GROUP BY expressions of a SELECT.
pub fn group_by(s: &Select) -> &[Expr] {
    match &s.group_by {
        GroupByExpr::Expressions(v, _) => v,
        GroupByExpr::All(_) => &[],
    }
}

/// A range condition on a column: `c BETWEEN … AND …`, `c >= …`, `c > …`, `c < …`,
/// `c <= …` (either side): the column.
pub fn range_column(e: &Expr) -> Option<(Option<String>, String)> {
    match e {
        Expr::Between {
            expr,
            negated: false,
            ..
        } => column(expr),
        Expr::BinaryOp {
            left,
            op:
                BinaryOperator::Gt | BinaryOperator::GtEq | BinaryOperator::Lt | BinaryOperator::LtEq,
            right,
        } => column(left).or_else(|| column(right)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_with_collapsed_lists() {
        let s = parse_digest("SELECT * FROM `t` WHERE `id` IN (...) AND `x` = ?").unwrap();
        assert_eq!(tables(&s), ["t"]);
        let w = where_of(&s).unwrap();
        assert_eq!(equality_columns(w), [(None, "x".to_string())]);
        assert!(parse_digest("INSERT INTO t VALUES (...) /* , ... */").is_some());
        assert!(parse_digest("SELECT 1; SELECT 2").is_none());
        // MariaDB's spelling.
        let s = parse_digest(
            "INSERT INTO `visits` ( `uid` , `visitor` , AT ) VALUES ( ?, ... , NOW (?) ) ",
        )
        .unwrap();
        assert_eq!(tables(&s), ["visits"]);
        assert!(parse_digest(
            "SELECT `grp` , COUNT ( * ) FROM `recent` WHERE `created_at` >= NOW ( ) - INTERVAL ? SQL_TSI_DAY GROUP BY `grp` "
        )
        .is_some());
        assert!(parse_digest(
            "DELETE `l` FROM `visits` `l` JOIN ( SELECT `uid` , ID FROM `visits` WHERE `uid` = ? ORDER BY ID DESC LIMIT ? OFFSET ? ) `t` ON `l` . `uid` = `t` . `uid` AND `l` . `id` < `t` . `id` "
        )
        .is_some());
    }

    #[test]
    fn literals_and_tables() {
        let s = parse_digest(
            "DELETE l FROM log l JOIN (SELECT uid, id FROM db2.log WHERE uid = 7 ORDER BY id DESC LIMIT 1 OFFSET 4) t ON l.uid = t.uid AND l.id < t.id",
        )
        .unwrap();
        assert_eq!(tables(&s), ["log", "db2.log"]);
        let qs = queries(&s);
        let inner = qs.iter().find(|q| !order_by(q).is_empty()).unwrap();
        let (l, o) = limit_offset(inner);
        assert_eq!(
            (l.and_then(integer), o.and_then(integer)),
            (Some(1), Some(4))
        );
        let s = parse_digest("SELECT a FROM t WHERE b = 'x' AND c = 3").unwrap();
        assert_eq!(
            first_equality_literal(&s),
            Some(("b".to_string(), "x".to_string()))
        );
    }
}
