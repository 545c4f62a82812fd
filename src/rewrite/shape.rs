//! AST helpers shared by the rule kinds: recognising values, columns and key
//! conditions, and replacing reads of a logical table by a derived table.

use std::ops::ControlFlow;

use sqlparser::ast::{
    BinaryOperator, Expr, Ident, ObjectName, Statement, TableAlias, TableFactor, UnaryOperator,
    VisitMut, VisitorMut,
};

use super::parse_statements;
use super::refusal::Refusal;

/// Statements that change a table's definition or bulk-replace its contents; rules
/// refuse them on their logical table (the physical tables would fall out of step).
pub fn is_table_ddl(stmt: &Statement) -> bool {
    matches!(
        stmt,
        Statement::Truncate(_)
            | Statement::AlterTable(_)
            | Statement::Drop { .. }
            | Statement::RenameTable(_)
            | Statement::LockTables { .. }
            | Statement::LoadData { .. }
    )
}

/// The refusal of a [`is_table_ddl`] statement on the logical table of a `kind` rule
/// ("counter", "ring") whose physical tables are named `physical`.
pub fn ddl_rejection(
    stmt: &Statement,
    kind: &str,
    table: &super::TableName,
    physical: &str,
) -> Refusal {
    let text = stmt.to_string();
    let verb = text
        .split_whitespace()
        .next()
        .unwrap_or("this statement")
        .to_ascii_uppercase();
    Refusal::ddl(format!(
        "{verb} of {kind} table {table} is not supported through heatsink; run it on the database directly and keep the {physical} in step"
    ))
}

/// Refuses the clauses of a write to a rule's table that no rule rewrites, rather
/// than dropping them: `RETURNING` (the client would get an OK instead of rows, or a
/// syntax error MariaDB gives for UPDATE … RETURNING would become a write), and the
/// other dialects' clauses sqlparser accepts. Every field is named, so a new one in a
/// later sqlparser is a compile error here, not a silently ignored clause.
pub fn unsupported_clauses(stmt: &Statement) -> Result<(), Refusal> {
    let found: &[(&str, bool)] = match stmt {
        Statement::Update(sqlparser::ast::Update {
            update_token: _,
            optimizer_hints: _,
            table: _,
            assignments: _,
            from: _,
            selection: _,
            returning,
            output,
            or,
            order_by: _,
            limit: _,
        }) => &[
            ("RETURNING", returning.is_some()),
            ("OUTPUT", output.is_some()),
            ("OR …", or.is_some()),
        ],
        Statement::Delete(sqlparser::ast::Delete {
            delete_token: _,
            optimizer_hints: _,
            tables: _,
            from: _,
            using: _,
            selection: _,
            returning,
            output,
            order_by: _,
            limit: _,
        }) => &[
            ("RETURNING", returning.is_some()),
            ("OUTPUT", output.is_some()),
        ],
        Statement::Insert(sqlparser::ast::Insert {
            insert_token: _,
            optimizer_hints: _,
            or,
            ignore: _,
            into: _,
            table: _,
            table_alias,
            columns: _,
            overwrite,
            source: _,
            assignments: _,
            partitioned,
            after_columns,
            has_table_keyword,
            on: _,
            returning,
            output,
            replace_into: _,
            priority: _,
            insert_alias,
            settings,
            format_clause,
            multi_table_insert_type,
            multi_table_into_clauses,
            multi_table_when_clauses,
            multi_table_else_clause,
        }) => &[
            ("RETURNING", returning.is_some()),
            (
                "PARTITION",
                partitioned.is_some() || !after_columns.is_empty(),
            ),
            (
                "a table alias",
                table_alias.is_some() || insert_alias.is_some(),
            ),
            ("OUTPUT", output.is_some()),
            ("OR …", or.is_some()),
            ("OVERWRITE", *overwrite || *has_table_keyword),
            ("SETTINGS", settings.is_some() || format_clause.is_some()),
            (
                "a multi-table INSERT",
                multi_table_insert_type.is_some()
                    || !multi_table_into_clauses.is_empty()
                    || !multi_table_when_clauses.is_empty()
                    || multi_table_else_clause.is_some(),
            ),
        ],
        _ => &[],
    };
    match found.iter().find(|(_, present)| *present) {
        Some((clause, _)) => Err(Refusal::shape(format!(
            "{clause} in a write to this table cannot be rewritten"
        ))),
        None => Ok(()),
    }
}

/// Parses SQL a rule generated; a failure is a bug in the rule, reported as such.
pub fn parse(sql: &str) -> Result<Vec<Statement>, Refusal> {
    parse_statements(sql).map_err(|e| {
        Refusal::internal(format!(
            "internal error: rewritten SQL does not parse ({e}): {sql}"
        ))
    })
}

/// Case-insensitive identifier comparison.
pub fn eq(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// The last part of a name (`db.t` → `t`).
pub fn last_ident(name: &ObjectName) -> String {
    name.0
        .last()
        .and_then(|p| p.as_ident())
        .map(|i| i.value.clone())
        .unwrap_or_default()
}

/// The top SELECT of a query without `WITH`, `FETCH`, locking, `FOR`, settings or
/// pipe operators, and with nothing but a projection, FROM, WHERE and GROUP BY
/// (no DISTINCT, HAVING, hints, windows, …); `None` for anything else. `ORDER BY`
/// and `LIMIT` are the caller's to read.
pub fn plain_select(q: &sqlparser::ast::Query) -> Option<&sqlparser::ast::Select> {
    let plain = q.with.is_none()
        && q.fetch.is_none()
        && q.locks.is_empty()
        && q.for_clause.is_none()
        && q.settings.is_none()
        && q.format_clause.is_none()
        && q.pipe_operators.is_empty();
    let sqlparser::ast::SetExpr::Select(sel) = q.body.as_ref() else {
        return None;
    };
    let simple = sel.optimizer_hints.is_empty()
        && sel.distinct.is_none()
        && sel.select_modifiers.is_none()
        && sel.top.is_none()
        && sel.exclude.is_none()
        && sel.into.is_none()
        && sel.lateral_views.is_empty()
        && sel.prewhere.is_none()
        && sel.connect_by.is_empty()
        && sel.cluster_by.is_empty()
        && sel.distribute_by.is_empty()
        && sel.sort_by.is_empty()
        && sel.having.is_none()
        && sel.named_window.is_empty()
        && sel.qualify.is_none()
        && sel.value_table_mode.is_none()
        && sel.flavor == sqlparser::ast::SelectFlavor::Standard;
    (plain && simple).then_some(sel.as_ref())
}

/// A FROM item that is a plain table (no hints, partitions, index hints, table
/// function or sample): its name as written and the name it is read under (its
/// alias, else its last name part). `None` for anything else, and for an alias with
/// column names.
pub fn plain_table(f: &sqlparser::ast::TableFactor) -> Option<(&ObjectName, String)> {
    let sqlparser::ast::TableFactor::Table {
        name,
        alias,
        args: None,
        with_hints,
        version: None,
        with_ordinality: false,
        partitions,
        json_path: None,
        sample: None,
        index_hints,
    } = f
    else {
        return None;
    };
    if !with_hints.is_empty() || !partitions.is_empty() || !index_hints.is_empty() {
        return None;
    }
    let alias = match alias {
        Some(a) if a.columns.is_empty() => a.name.value.clone(),
        Some(_) => return None,
        None => last_ident(name),
    };
    Some((name, alias))
}

/// The column an expression names (`c`, `t.c`, `db.t.c`), if it is a column.
pub fn column_name(e: &Expr) -> Option<String> {
    match e {
        Expr::Identifier(i) => Some(i.value.clone()),
        Expr::CompoundIdentifier(p) => p.last().map(|i| i.value.clone()),
        Expr::Nested(inner) => column_name(inner),
        _ => None,
    }
}

/// A value from the client: a literal, marker or parameter, possibly signed,
/// parenthesised or with a charset introducer. No column, no function.
pub fn is_value(e: &Expr) -> bool {
    match e {
        Expr::Value(_) => true,
        Expr::UnaryOp {
            op: UnaryOperator::Minus | UnaryOperator::Plus,
            expr,
        } => is_value(expr),
        Expr::Nested(inner) => is_value(inner),
        Expr::Prefixed { value, .. } => is_value(value),
        _ => false,
    }
}

/// Splits `a AND b AND c` into its terms.
pub fn conjuncts<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            conjuncts(left, out);
            conjuncts(right, out);
        }
        Expr::Nested(inner) => conjuncts(inner, out),
        other => out.push(other),
    }
}

/// Whether any column the expression names satisfies `pred`.
pub fn mentions_column(e: &Expr, pred: impl Fn(&str) -> bool) -> bool {
    let mut found = false;
    let _ = sqlparser::ast::visit_expressions(e, |x| {
        if column_name(x).is_some_and(|c| pred(&c)) {
            found = true;
        }
        ControlFlow::<()>::Continue(())
    });
    found
}

/// Refuses columns qualified by anything but `name` (the alias of a single-table
/// UPDATE or DELETE target when `alias`, or its table name) in `exprs`: MariaDB
/// answers `UPDATE hits AS h SET hits.cnt = …` with 1054, and rewrites that drop
/// qualifiers would run it.
pub fn check_qualifiers<'e>(
    exprs: impl IntoIterator<Item = &'e Expr>,
    name: &str,
    alias: bool,
) -> Result<(), Refusal> {
    let mut bad = None;
    for e in exprs {
        let _ = sqlparser::ast::visit_expressions(e, |x| {
            if let Expr::CompoundIdentifier(parts) = x {
                if let Some(q) = parts.len().checked_sub(2).map(|i| &parts[i]) {
                    // Aliases compare case-insensitively, table names exactly.
                    if q.value != name && !(alias && eq(&q.value, name)) {
                        bad = Some(x.to_string());
                        return ControlFlow::Break(());
                    }
                }
            }
            ControlFlow::Continue(())
        });
        if let Some(col) = bad {
            return Err(Refusal::shape(format!(
                "column {col} is qualified by another name than the table's `{name}`"
            )));
        }
    }
    Ok(())
}

/// [`check_qualifiers`] for a single-table UPDATE: its assignments' targets and
/// values, WHERE and ORDER BY.
pub fn check_update_qualifiers(u: &sqlparser::ast::Update) -> Result<(), Refusal> {
    let Some((q, alias)) = target_qualifier(&u.table.relation) else {
        return Ok(());
    };
    for a in &u.assignments {
        if let sqlparser::ast::AssignmentTarget::ColumnName(col) = &a.target {
            let parts = &col.0;
            if let Some(sqlparser::ast::ObjectNamePart::Identifier(id)) =
                parts.len().checked_sub(2).and_then(|i| parts.get(i))
            {
                if id.value != q && !(alias && eq(&id.value, &q)) {
                    return Err(Refusal::shape(format!(
                        "column {col} is qualified by another name than the table's `{q}`"
                    )));
                }
            }
        }
    }
    check_qualifiers(
        u.assignments
            .iter()
            .map(|a| &a.value)
            .chain(u.selection.iter())
            .chain(u.order_by.iter().map(|o| &o.expr)),
        &q,
        alias,
    )
}

/// The name columns of a single-table UPDATE or DELETE target are qualified with:
/// its alias (`true`), or its table name.
pub fn target_qualifier(relation: &TableFactor) -> Option<(String, bool)> {
    match relation {
        TableFactor::Table { alias: Some(a), .. } => Some((a.name.value.clone(), true)),
        TableFactor::Table { name, .. } => Some((last_ident(name), false)),
        _ => None,
    }
}

/// The condition with qualified columns (`t.c`) made unqualified (`c`), so it can be
/// applied to another table with the same column names. Refuses subqueries, and
/// columns for which `allowed` is false (named in the error).
pub fn requalify(cond: &Expr, allowed: impl Fn(&str) -> bool) -> Result<Expr, Refusal> {
    let mut w = cond.clone();
    let mut bad = None;
    let _ = sqlparser::ast::visit_expressions_mut(&mut w, |e| {
        match e {
            Expr::CompoundIdentifier(parts) => {
                if let Some(last) = parts.last().cloned() {
                    *e = Expr::Identifier(last);
                }
            }
            Expr::Subquery(_) | Expr::InSubquery { .. } | Expr::Exists { .. } => {
                bad = Some("a subquery".to_string());
            }
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
    let _ = sqlparser::ast::visit_expressions(&w, |e| {
        if let Expr::Identifier(id) = e {
            if !allowed(&id.value) {
                bad = Some(format!("column `{}`", id.value));
            }
        }
        ControlFlow::<()>::Continue(())
    });
    match bad {
        Some(what) => Err(Refusal::shape(what)),
        None => Ok(w),
    }
}

/// The values given to every key column by a `k1 = v1 AND k2 = v2` condition, in key
/// order; `None` for any other shape (extra terms, ranges, missing keys).
pub fn key_equalities(key: &[String], cond: Option<&Expr>) -> Option<Vec<Expr>> {
    let mut found: Vec<Option<Expr>> = vec![None; key.len()];
    if let Some(w) = cond {
        let mut terms = Vec::new();
        conjuncts(w, &mut terms);
        for t in terms {
            let Expr::BinaryOp {
                left,
                op: BinaryOperator::Eq,
                right,
            } = t
            else {
                return None;
            };
            let (col, val) = match (column_name(left), column_name(right)) {
                (Some(c), None) if is_value(right) => (c, right),
                (None, Some(c)) if is_value(left) => (c, left),
                _ => return None,
            };
            let i = key.iter().position(|k| eq(k, &col))?;
            if found[i].replace((**val).clone()).is_some() {
                return None;
            }
        }
    }
    found.into_iter().collect()
}

/// Replaces every table factor naming a logical table by a derived table with the
/// same alias (the table's name when it had none). Returns the aliases used; an
/// empty list when the statement does not read the table.
pub fn replace_reads(
    stmt: &mut Statement,
    names_table: &dyn Fn(&ObjectName) -> bool,
    derived_sql: &dyn Fn(&ObjectName) -> Result<String, Refusal>,
) -> Result<Vec<String>, Refusal> {
    let mut v = Replacer {
        names_table,
        derived_sql,
        aliases: Vec::new(),
        error: None,
    };
    let _ = stmt.visit(&mut v);
    match v.error {
        Some(e) => Err(e),
        None => Ok(v.aliases),
    }
}

struct Replacer<'a> {
    names_table: &'a dyn Fn(&ObjectName) -> bool,
    derived_sql: &'a dyn Fn(&ObjectName) -> Result<String, Refusal>,
    aliases: Vec<String>,
    error: Option<Refusal>,
}

impl VisitorMut for Replacer<'_> {
    type Break = ();

    // Post-visit: the derived table put in place is not visited again.
    fn post_visit_table_factor(&mut self, f: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table { name, alias, .. } = f else {
            return ControlFlow::Continue(());
        };
        if !(self.names_table)(name) {
            return ControlFlow::Continue(());
        }
        let alias_name = match alias {
            Some(a) => a.name.clone(),
            None => name
                .0
                .last()
                .and_then(|p| p.as_ident())
                .cloned()
                .unwrap_or_else(|| Ident::new("t")),
        };
        let subquery = match (self.derived_sql)(name).and_then(|sql| parse(&sql)) {
            Ok(mut v) => match v.pop() {
                Some(Statement::Query(q)) => q,
                _ => {
                    self.error = Some(Refusal::internal(
                        "internal error: the derived table is not a query",
                    ));
                    return ControlFlow::Break(());
                }
            },
            Err(e) => {
                self.error = Some(e);
                return ControlFlow::Break(());
            }
        };
        self.aliases.push(alias_name.value.clone());
        *f = TableFactor::Derived {
            lateral: false,
            subquery,
            alias: Some(TableAlias {
                explicit: true,
                name: alias_name,
                columns: Vec::new(),
                at: None,
            }),
            sample: None,
        };
        ControlFlow::Continue(())
    }
}

/// A logical table's column definitions, learned from the database once per
/// database (a rule without a database applies to a table of that name in each).
pub struct ColumnsByDb {
    /// The rule's logical table.
    table: super::TableName,
    /// Columns by lower-cased database name.
    map: std::sync::RwLock<std::collections::HashMap<String, std::sync::Arc<Vec<ColumnDef>>>>,
}

use crate::wire::resultset::ColumnDef;

impl ColumnsByDb {
    /// An empty cache for `table`.
    pub fn new(table: super::TableName) -> Self {
        ColumnsByDb {
            table,
            map: Default::default(),
        }
    }

    /// The database the rule means for a connection whose default is `current_db`.
    fn database<'a>(&'a self, current_db: Option<&'a str>) -> Option<&'a str> {
        self.table.db.as_deref().or(current_db)
    }

    /// The query to run when the columns for `current_db` are not known yet.
    pub fn query(&self, current_db: Option<&str>) -> Option<String> {
        let db = self.database(current_db)?;
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        if map.contains_key(&db.to_ascii_lowercase()) {
            return None;
        }
        Some(format!(
            "SELECT * FROM {}.{} LIMIT 0",
            crate::rules::spec::quote(db),
            crate::rules::spec::quote(&self.table.name)
        ))
    }

    /// Stores the answer to [`ColumnsByDb::query`].
    pub fn provide(&self, current_db: Option<&str>, columns: &[ColumnDef]) {
        if let Some(db) = self.database(current_db) {
            let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
            map.entry(db.to_ascii_lowercase())
                .or_insert_with(|| std::sync::Arc::new(columns.to_vec()));
        }
    }

    /// The columns for a connection whose default database is `current_db`.
    pub fn get(&self, current_db: Option<&str>) -> Result<std::sync::Arc<Vec<ColumnDef>>, Refusal> {
        let db = self.database(current_db).ok_or_else(|| {
            Refusal::schema(
                "no database selected: select one (USE db) or name it in the rule's table",
            )
        })?;
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.get(&db.to_ascii_lowercase())
            .cloned()
            .ok_or_else(|| Refusal::schema("the table's columns are not known yet"))
    }
}

/// A column definition's original column name.
pub fn column_def_name(d: &ColumnDef) -> String {
    String::from_utf8_lossy(&d.org_name).into_owned()
}
