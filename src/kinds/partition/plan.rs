//! The partition planner: lookups by key get a predicate on the partition column,
//! so MariaDB reads only the partitions of the key's date ± the tolerance.
//!
//! A `key = v` or `key IN (v, …)` term of a WHERE (text or prepared; of a SELECT at
//! any level, of an UPDATE or a DELETE, also with joins) adds
//! `AND col BETWEEN <date of v> - tolerance AND <date of v> + tolerance`, computed by
//! the server from `v` itself in the session's time zone (see `keytime.rs`): one
//! plan per statement shape. Rows the WHERE selects have that key, and every row
//! lies within its key's range (the insert trigger refuses others, `check` counts
//! them), so the statement's results, affected rows and errors are unchanged. A key
//! whose time cannot be read widens the range to every partition.
//!
//! An INSERT that omits the partition column gets it from the key. Everything else
//! passes through unchanged: the rule only ever adds an implied condition, so a
//! statement it does not understand is still exact, only unpruned (a lookup it
//! could not prune is counted as the rule's fallback).

use std::ops::ControlFlow;

use sqlparser::ast::{
    BinaryOperator, Expr, FromTable, Insert, Query, SetExpr, Statement, TableFactor,
    TableWithJoins, VisitMut, VisitorMut,
};

use super::keytime::KeyTimeSql;
use super::spec::PartitionSpec;
use crate::kinds::logical::LogicalTable;
use crate::rewrite::shape::{column_name, conjuncts, eq, last_ident, parse};
use crate::rewrite::{ParamCheck, Plan, PlanContext, Refusal, Rule, Slot, TableName};
use crate::rules::spec::quote;
use crate::wire::resultset::{types, ColumnDef};

/// Most values of an `IN` list a lookup is pruned for (each adds a range to the
/// statement); longer lists pass through unpruned, counted as fallbacks.
pub const MAX_IN_VALUES: usize = 50;

/// A `[[partition]]` rule, ready to plan statements.
pub struct PartitionRule {
    /// Rule name from the file.
    name: String,
    /// The partitioned table, with the key column as its key.
    logical: LogicalTable,
    /// The key column.
    key: String,
    /// The partition column.
    column: String,
    /// How the key's time is read.
    time: KeyTimeSql,
    /// Days the partition column may lie from the key's date.
    tolerance: u32,
    /// `mode = "shadow"`.
    shadow: bool,
}

/// What the key column compares as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyType {
    /// A string column: values must be strings, else MariaDB compares numerically.
    String,
    /// An integer column: values must be integers.
    Integer,
}

/// The column types the planner needs, from the table's definitions.
struct Types {
    /// The key column's.
    key: KeyType,
    /// The partition column is a DATETIME or TIMESTAMP (not a DATE).
    datetime: bool,
    /// The partition column has a default value (no NO_DEFAULT_VALUE flag).
    has_default: bool,
}

/// Column flag: the column has no default value.
const NO_DEFAULT_VALUE_FLAG: u16 = 0x1000;

impl PartitionRule {
    /// Builds the rule from a validated spec.
    pub fn new(spec: &PartitionSpec) -> Result<Self, String> {
        spec.validate()?;
        Ok(PartitionRule {
            name: spec.name.clone(),
            logical: LogicalTable::new(TableName::parse(&spec.table)?, vec![spec.key.clone()]),
            key: spec.key.clone(),
            column: spec.column.clone(),
            time: super::key_time_sql(spec),
            tolerance: spec.tolerance_days,
            shadow: spec.mode == crate::rules::spec::Mode::Shadow,
        })
    }

    /// The key and partition column types, from the table's columns.
    fn types(&self, meta: &[ColumnDef]) -> Result<Types, Refusal> {
        let find = |name: &str| {
            meta.iter()
                .find(|c| eq(&String::from_utf8_lossy(&c.org_name), name))
                .ok_or_else(|| {
                    Refusal::schema(format!(
                        "table {} has no column `{name}`",
                        self.logical.name()
                    ))
                })
        };
        let key = find(&self.key)?;
        let key = match key.column_type {
            types::TINY | types::SHORT | types::LONG | types::INT24 | types::LONGLONG => {
                KeyType::Integer
            }
            0x0f | 0xf9..=0xfe => KeyType::String,
            t => {
                return Err(Refusal::schema(format!(
                "key column `{}` has type {t:#04x}; a partition rule needs a string or integer key",
                self.key
            )))
            }
        };
        let col = find(&self.column)?;
        let datetime = match col.column_type {
            types::DATE => false,
            types::DATETIME | types::TIMESTAMP => true,
            t => {
                return Err(Refusal::schema(format!(
                "column `{}` has type {t:#04x}; a partition rule needs a DATE or DATETIME column",
                self.column
            )))
            }
        };
        Ok(Types {
            key,
            datetime,
            has_default: col.flags & NO_DEFAULT_VALUE_FLAG == 0,
        })
    }
}

/// One planning run over a statement.
struct Pruner<'r, 'c> {
    rule: &'r PartitionRule,
    ctx: &'r PlanContext<'c>,
    types: &'r Types,
    /// Lookups given a partition predicate.
    pruned: usize,
    /// Lookups by key that could not be (a value of another type, an expression, a
    /// long IN list, an ambiguous reference).
    missed: usize,
    /// Checks of prepared parameters used as keys.
    param_checks: Vec<(usize, ParamCheck)>,
    /// A failure to build the predicate (a bug in the rule, reported).
    error: Option<Refusal>,
}

impl Pruner<'_, '_> {
    /// The qualifiers (alias, else table name) of the references to the rule's table
    /// among `from`'s tables and joins.
    fn refs(&self, from: &[TableWithJoins]) -> Vec<String> {
        let mut out = Vec::new();
        for t in from {
            for f in std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)) {
                if let TableFactor::Table { name, alias, .. } = f {
                    if self.rule.logical.named_by(name, self.ctx) {
                        out.push(match alias {
                            Some(a) => a.name.value.clone(),
                            None => last_ident(name),
                        });
                    }
                }
            }
        }
        out
    }

    /// Whether `v` may serve as a key value, recording a prepared parameter's check.
    /// `None` for NULL (it matches no row); `Some(false)` for values that would not
    /// compare as the key's type.
    fn usable(&mut self, v: &Expr) -> Option<bool> {
        let mut inner = v;
        while let Expr::Nested(x) = inner {
            inner = x;
        }
        if let Expr::Value(val) = inner {
            if matches!(val.value, sqlparser::ast::Value::Null) {
                return None;
            }
        }
        if let Some(Slot::Param(j)) = self.ctx.slot(inner) {
            let check = match self.types.key {
                KeyType::String => ParamCheck::String {
                    max_bytes: usize::MAX,
                },
                KeyType::Integer => ParamCheck::Integer {
                    min: i128::from(i64::MIN),
                    max: i128::from(u64::MAX),
                },
            };
            if !self.param_checks.contains(&(j, check)) {
                self.param_checks.push((j, check));
            }
            return Some(true);
        }
        let class = self.ctx.literal_class(inner);
        Some(matches!(
            (self.types.key, class),
            (
                KeyType::String,
                Some(crate::rewrite::LiteralClass::String { .. })
            ) | (
                KeyType::Integer,
                Some(crate::rewrite::LiteralClass::Integer { .. })
            )
        ))
    }

    /// The predicate a key term implies, if it is a usable lookup of one of `refs`.
    /// `Err(())`: a lookup by key that cannot be pruned.
    fn implied(&mut self, term: &Expr, refs: &[String]) -> Result<Option<String>, ()> {
        let (col, values): (&Expr, Vec<&Expr>) = match term {
            Expr::BinaryOp {
                left,
                op: BinaryOperator::Eq,
                right,
            } => match (column_name(left), column_name(right)) {
                (Some(_), None) => (left, vec![right]),
                (None, Some(_)) => (right, vec![left]),
                _ => return Ok(None),
            },
            Expr::InList {
                expr,
                list,
                negated: false,
            } => (expr, list.iter().collect()),
            _ => return Ok(None),
        };
        let Some(name) = column_name(col) else {
            return Ok(None);
        };
        if !eq(&name, &self.rule.key) {
            return Ok(None);
        }
        let qualifier = match col {
            Expr::CompoundIdentifier(parts) if parts.len() >= 2 => {
                let q = &parts[parts.len() - 2].value;
                match refs.iter().find(|r| eq(r, q)) {
                    Some(r) => r.clone(),
                    None => return Ok(None),
                }
            }
            Expr::Identifier(_) if refs.len() == 1 => refs[0].clone(),
            Expr::Identifier(_) => return Err(()),
            _ => return Ok(None),
        };
        if values.len() > MAX_IN_VALUES {
            return Err(());
        }
        let target = format!("{}.{}", quote(&qualifier), quote(&self.rule.column));
        let mut ranges = Vec::new();
        for v in values {
            match self.usable(v) {
                None => continue,
                Some(false) => return Err(()),
                Some(true) => ranges.push(self.rule.time.range(
                    &v.to_string(),
                    &target,
                    self.rule.tolerance,
                    self.types.datetime,
                )),
            }
        }
        match ranges.len() {
            0 => Ok(None),
            1 => Ok(ranges.pop()),
            _ => Ok(Some(format!("({})", ranges.join(" OR ")))),
        }
    }

    /// Adds the partition predicate to a WHERE over `from` when one of its terms is
    /// a lookup by key.
    fn prune(&mut self, from: &[TableWithJoins], selection: &mut Option<Expr>) {
        let Some(w) = selection.as_ref() else {
            return;
        };
        let refs = self.refs(from);
        if refs.is_empty() {
            return;
        }
        let mut terms = Vec::new();
        conjuncts(w, &mut terms);
        let mut missed = false;
        let mut found = None;
        for t in terms {
            match self.implied(t, &refs) {
                Ok(Some(p)) => {
                    found = Some(p);
                    break;
                }
                Ok(None) => {}
                Err(()) => missed = true,
            }
        }
        let Some(pred) = found else {
            self.missed += usize::from(missed);
            return;
        };
        match parse(&format!("SELECT 1 FROM t WHERE ({w}) AND {pred}")) {
            Ok(mut v) => match v.pop() {
                Some(Statement::Query(q)) => match *q.body {
                    SetExpr::Select(s) => {
                        *selection = s.selection;
                        self.pruned += 1;
                    }
                    _ => {
                        self.error = Some(Refusal::internal(
                            "internal error: predicate is not a SELECT",
                        ))
                    }
                },
                _ => {
                    self.error = Some(Refusal::internal(
                        "internal error: predicate is not a query",
                    ))
                }
            },
            Err(e) => self.error = Some(e),
        }
    }

    /// Every SELECT of a query body (UNION parts included; nested queries are
    /// visited on their own).
    fn prune_query(&mut self, q: &mut Query) {
        let mut stack: Vec<&mut SetExpr> = vec![&mut q.body];
        while let Some(s) = stack.pop() {
            match s {
                SetExpr::Select(sel) => {
                    let sel = &mut **sel;
                    self.prune(&sel.from, &mut sel.selection);
                }
                SetExpr::SetOperation { left, right, .. } => {
                    stack.push(left);
                    stack.push(right);
                }
                _ => {}
            }
        }
    }
}

impl VisitorMut for Pruner<'_, '_> {
    type Break = ();

    fn pre_visit_query(&mut self, q: &mut Query) -> ControlFlow<()> {
        self.prune_query(q);
        ControlFlow::Continue(())
    }

    fn pre_visit_statement(&mut self, s: &mut Statement) -> ControlFlow<()> {
        match s {
            Statement::Update(u) => {
                let mut from = vec![u.table.clone()];
                if let Some(f) = &u.from {
                    match f {
                        sqlparser::ast::UpdateTableFromKind::BeforeSet(v)
                        | sqlparser::ast::UpdateTableFromKind::AfterSet(v) => {
                            from.extend(v.iter().cloned())
                        }
                    }
                }
                self.prune(&from, &mut u.selection);
            }
            Statement::Delete(d) => {
                let mut from = match &d.from {
                    FromTable::WithFromKeyword(f) | FromTable::WithoutKeyword(f) => f.clone(),
                };
                if let Some(using) = &d.using {
                    from.extend(using.iter().cloned());
                }
                self.prune(&from, &mut d.selection);
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

impl PartitionRule {
    /// An INSERT into the table that omits the partition column: the column is
    /// added, with the key's date (or time, for a DATETIME column) in the session's
    /// time zone; a key whose time cannot be read gets the column's default, as
    /// the statement would have (a column without a default gets NULL: the insert
    /// then fails with 1048 where the statement would have failed with 1364, or
    /// stores the zero date with that warning outside strict mode).
    fn plan_insert(
        &self,
        ins: &Insert,
        stmt: &Statement,
        types: &Types,
    ) -> Result<Option<Plan>, Refusal> {
        if ins.columns.is_empty()
            || ins.columns.iter().any(|c| eq(&last_ident(c), &self.column))
            || !ins.assignments.is_empty()
        {
            return Ok(None);
        }
        let Some(ki) = ins
            .columns
            .iter()
            .position(|c| eq(&last_ident(c), &self.key))
        else {
            return Ok(None);
        };
        let Some(src) = &ins.source else {
            return Ok(None);
        };
        let SetExpr::Values(values) = &*src.body else {
            return Ok(None);
        };
        let mut out = stmt.clone();
        let Statement::Insert(new) = &mut out else {
            return Ok(None);
        };
        new.columns.push(sqlparser::ast::ObjectName::from(vec![
            sqlparser::ast::Ident::with_quote('`', self.column.clone()),
        ]));
        let Some(src) = new.source.as_mut() else {
            return Ok(None);
        };
        let SetExpr::Values(new_values) = &mut *src.body else {
            return Ok(None);
        };
        for (row, new_row) in values.rows.iter().zip(new_values.rows.iter_mut()) {
            // Only a value (literal or parameter): an expression such as `UUID()`
            // would be evaluated again, differently, for the column.
            let Some(k) = row.get(ki).filter(|k| crate::rewrite::shape::is_value(k)) else {
                return Ok(None);
            };
            if row.len() != ins.columns.len() {
                return Ok(None);
            }
            let k = k.to_string();
            let when = if types.datetime {
                self.time.datetime(&k)
            } else {
                self.time.date(&k)
            };
            let otherwise = if types.has_default {
                format!("DEFAULT({})", quote(&self.column))
            } else {
                "NULL".to_string()
            };
            let sql = format!("SELECT IF({}, {when}, {otherwise})", self.time.readable(&k));
            let mut v = parse(&sql)?;
            let Some(Statement::Query(q)) = v.pop() else {
                return Err(Refusal::internal(
                    "internal error: fill expression is not a query",
                ));
            };
            let SetExpr::Select(s) = *q.body else {
                return Err(Refusal::internal(
                    "internal error: fill expression is not a SELECT",
                ));
            };
            let Some(sqlparser::ast::SelectItem::UnnamedExpr(e)) = s.projection.into_iter().next()
            else {
                return Err(Refusal::internal(
                    "internal error: fill expression has no value",
                ));
            };
            new_row.content.push(e);
        }
        Ok(Some(Plan::from(vec![out])))
    }
}

impl Rule for PartitionRule {
    fn name(&self) -> &str {
        &self.name
    }

    fn tables(&self) -> &[TableName] {
        self.logical.tables()
    }

    fn shadow(&self) -> bool {
        self.shadow
    }

    /// The table holds every row (a statement run unchanged is only unpruned), and
    /// its triggers refuse rows whose key and time disagree, whatever the insert.
    fn runs_unread(&self) -> bool {
        true
    }

    fn metadata_query(&self, current_db: Option<&str>) -> Option<String> {
        self.logical.metadata_query(current_db)
    }

    fn provide_metadata(&self, current_db: Option<&str>, columns: &[ColumnDef]) {
        self.logical.provide_metadata(current_db, columns);
    }

    fn plan(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, Refusal> {
        let interesting = matches!(
            stmt,
            Statement::Query(_)
                | Statement::Update(_)
                | Statement::Delete(_)
                | Statement::Insert(_)
                | Statement::Explain { .. }
        );
        if !interesting {
            return Ok(None);
        }
        // The rule only ever prunes: when the table's columns do not fit it (or
        // no database is selected), statements pass through, counted.
        let Ok(types) = self.logical.columns(ctx).and_then(|m| self.types(&m)) else {
            return Ok(Some(Plan::fallback(
                "the table's columns do not fit the rule, or no database is selected",
            )));
        };
        if let Statement::Insert(ins) = stmt {
            let sqlparser::ast::TableObject::TableName(name) = &ins.table else {
                return Ok(None);
            };
            if self.logical.named_by(name, ctx) {
                return self.plan_insert(ins, stmt, &types);
            }
        }
        let mut out = stmt.clone();
        let mut p = Pruner {
            rule: self,
            ctx,
            types: &types,
            pruned: 0,
            missed: 0,
            param_checks: Vec::new(),
            error: None,
        };
        let _ = out.visit(&mut p);
        if let Some(e) = p.error {
            return Err(e);
        }
        if p.pruned == 0 {
            return Ok((p.missed > 0).then(|| {
                Plan::fallback(
                    "a lookup by key cannot be pruned to its partition (a value of another type, an expression, a long IN list or an ambiguous reference)",
                )
            }));
        }
        Ok(Some(Plan {
            statements: vec![out],
            param_checks: p.param_checks,
            ..Default::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::rewrite::testutil::{
        assert_fallbacks, assert_passthrough, assert_sql, col, rewrite,
    };
    use crate::rewrite::{Decision, Engine, StatementContext};

    const RULE: &str = "[[partition]]\nname = \"messages_by_day\"\ntable = \"Messages\"\nkey = \"UUID\"\n\
        key_time = \"unix\"\nkey_pattern = \"-([0-9]{10})-\"\ncolumn = \"Inserted\"\nretention_days = 30\n";

    fn engine() -> Engine {
        let spec: Vec<PartitionSpec> = crate::kinds::entries(RULE, "partition").unwrap();
        let e = Engine::new(vec![Arc::new(PartitionRule::new(&spec[0]).unwrap())], 100).unwrap();
        e.provide_metadata(
            0,
            Some("shop"),
            &[
                col("Messages", "ID", types::LONGLONG, 0x4203),
                col("Messages", "UUID", 0xfd, 0x1001),
                col("Messages", "Message", 0xfc, 0x1091),
                col("Messages", "Inserted", types::DATE, 0x1081),
            ],
        );
        e
    }

    fn range(key: &str, target: &str) -> String {
        let spec: Vec<PartitionSpec> = crate::kinds::entries(RULE, "partition").unwrap();
        super::super::key_time_sql(&spec[0]).range(key, target, 1, false)
    }

    const K: &str = "'3f9c0a51d2-1732406400-7be1c4d09a'";

    #[test]
    fn lookups_by_key_get_the_partition_predicate() {
        let e = engine();
        let r = rewrite(
            &e,
            &format!("SELECT Message FROM Messages WHERE UUID = {K}"),
        );
        assert_sql(
            &r,
            &[&format!(
                "SELECT Message FROM Messages WHERE (UUID = {K}) AND {}",
                range(K, "`Messages`.`Inserted`")
            )],
        );
        let r = rewrite(
            &e,
            &format!("SELECT m.Message FROM Messages AS m JOIN t ON t.id = m.ID WHERE t.x = 1 AND m.UUID IN ({K}, 'b', NULL)"),
        );
        assert_sql(
            &r,
            &[&format!(
                "SELECT m.Message FROM Messages AS m JOIN t ON t.id = m.ID WHERE (t.x = 1 AND m.UUID IN ({K}, 'b', NULL)) AND ({} OR {})",
                range(K, "`m`.`Inserted`"),
                range("'b'", "`m`.`Inserted`")
            )],
        );
        let r = rewrite(
            &e,
            &format!("UPDATE Messages SET Message = '{{}}' WHERE {K} = UUID LIMIT 1"),
        );
        assert_sql(
            &r,
            &[&format!(
                "UPDATE Messages SET Message = '{{}}' WHERE ({K} = UUID) AND {} LIMIT 1",
                range(K, "`Messages`.`Inserted`")
            )],
        );
        let r = rewrite(&e, &format!("DELETE FROM Messages WHERE UUID = {K}"));
        assert_sql(
            &r,
            &[&format!(
                "DELETE FROM Messages WHERE (UUID = {K}) AND {}",
                range(K, "`Messages`.`Inserted`")
            )],
        );
        // A subquery is pruned on its own.
        let r = rewrite(
            &e,
            &format!("SELECT * FROM t WHERE id IN (SELECT ID FROM Messages WHERE UUID = {K})"),
        );
        assert_sql(
            &r,
            &[&format!(
                "SELECT * FROM t WHERE id IN (SELECT ID FROM Messages WHERE (UUID = {K}) AND {})",
                range(K, "`Messages`.`Inserted`")
            )],
        );
    }

    #[test]
    fn lookups_that_cannot_be_pruned_fall_back_and_others_pass() {
        let e = engine();
        assert_fallbacks(
            &e,
            &[
                "SELECT * FROM Messages WHERE UUID = 1732406400",
                "SELECT * FROM Messages WHERE UUID = CONCAT('a', 'b')",
                "SELECT * FROM Messages a JOIN Messages b ON a.ID = b.ID WHERE UUID = 'x'",
            ],
        );
        assert_passthrough(
            &e,
            &[
                "SELECT * FROM Messages WHERE ID = 5",
                "SELECT * FROM Messages WHERE UUID = 'x' OR ID = 5",
                "SELECT * FROM Messages WHERE UUID = NULL",
                "INSERT INTO Messages (UUID, Message) VALUES (UUID(), '{}')",
                "INSERT INTO Messages (UUID, Message, Inserted) VALUES ('a', '{}', '2024-01-01')",
            ],
        );
    }

    #[test]
    fn explain_shows_the_pruned_statement() {
        let e = engine();
        for sql in [
            "EXPLAIN SELECT * FROM Messages WHERE UUID = 'x'",
            "EXPLAIN FORMAT=JSON SELECT * FROM Messages WHERE UUID = 'x'",
        ] {
            let r = rewrite(&e, sql);
            let printed = String::from_utf8_lossy(&r.statements[0]).into_owned();
            assert!(
                printed.contains("`Messages`.`Inserted` BETWEEN"),
                "{printed}"
            );
        }
    }

    #[test]
    fn explain_partitions_and_extended_explain_the_rewrite() {
        let e = engine();
        let lookup = "SELECT * FROM Messages WHERE UUID = 'x'";
        let plain = rewrite(&e, &format!("EXPLAIN {lookup}"));
        let want = crate::rewrite::parse_statements(&String::from_utf8_lossy(&plain.statements[0]))
            .unwrap();
        for head in ["EXPLAIN", "explain", "DESCRIBE", "DESC"] {
            for word in ["PARTITIONS", "EXTENDED", "partitions"] {
                let sql = format!("{head} {word} {lookup}");
                let r = rewrite(&e, &sql);
                let printed = String::from_utf8_lossy(&r.statements[0]).into_owned();
                let mut parts = printed.splitn(3, ' ');
                let (h, w, rest) = (parts.next(), parts.next(), parts.next());
                assert!(
                    h.is_some_and(|h| h.eq_ignore_ascii_case(head)) && w == Some(word),
                    "{sql}: {printed}"
                );
                let rest = rest.unwrap_or_default();
                assert_eq!(
                    crate::rewrite::parse_statements(&format!("EXPLAIN {rest}")).unwrap(),
                    want,
                    "{sql}"
                );
            }
        }
        // Not a lookup by key, another table, the table itself: as without the word.
        assert_passthrough(
            &e,
            &[
                "EXPLAIN PARTITIONS SELECT * FROM Messages WHERE ID = 5",
                "EXPLAIN PARTITIONS SELECT * FROM Other WHERE UUID = 'x'",
                "DESC EXTENDED Messages",
                "EXPLAIN EXTENDED",
            ],
        );
    }

    #[test]
    fn hourly_rules_prune_to_the_keys_hour() {
        let text = RULE.replace(
            "retention_days = 30",
            "period = \"hour\"\nretention_days = 30",
        );
        let spec: Vec<PartitionSpec> = crate::kinds::entries(&text, "partition").unwrap();
        let e = Engine::new(vec![Arc::new(PartitionRule::new(&spec[0]).unwrap())], 100).unwrap();
        e.provide_metadata(
            0,
            Some("shop"),
            &[
                col("Messages", "UUID", 0xfd, 0x1001),
                col("Messages", "Inserted", types::DATETIME, 0x1081),
            ],
        );
        let kt = super::super::key_time_sql(&spec[0]);
        assert!(kt.hourly);
        let r = rewrite(&e, &format!("SELECT * FROM Messages WHERE UUID = {K}"));
        assert_sql(
            &r,
            &[&format!(
                "SELECT * FROM Messages WHERE (UUID = {K}) AND {}",
                kt.range(K, "`Messages`.`Inserted`", 1, true)
            )],
        );
        let printed = String::from_utf8_lossy(&r.statements[0]).into_owned();
        assert!(printed.contains("INTERVAL 24 HOUR"), "{printed}");
        // A DATE column (which migrate refuses for hours): the day range, which
        // the hour range implies.
        e.provide_metadata(
            0,
            Some("other"),
            &[
                col("Messages", "UUID", 0xfd, 0x1001),
                col("Messages", "Inserted", types::DATE, 0x1081),
            ],
        );
        let d = e.decide(
            format!("SELECT * FROM Messages WHERE UUID = {K}").as_bytes(),
            &StatementContext {
                current_db: Some("other"),
                lexing: Some(crate::rewrite::Lexing::STANDARD),
                ..Default::default()
            },
        );
        let Decision::Rewrite(r) = d else {
            panic!("{d:?}")
        };
        assert_sql(
            &r,
            &[&format!(
                "SELECT * FROM Messages WHERE (UUID = {K}) AND {}",
                kt.range(K, "`Messages`.`Inserted`", 1, false)
            )],
        );
    }

    #[test]
    fn a_table_that_does_not_fit_the_rule_passes_statements_through() {
        let spec: Vec<PartitionSpec> = crate::kinds::entries(RULE, "partition").unwrap();
        let e = Engine::new(vec![Arc::new(PartitionRule::new(&spec[0]).unwrap())], 100).unwrap();
        e.provide_metadata(
            0,
            Some("shop"),
            &[
                col("Messages", "UUID", 0xfd, 0x1001),
                col("Messages", "Day", types::DATE, 0),
            ],
        );
        assert_fallbacks(
            &e,
            &["SELECT * FROM Messages WHERE UUID = 'x-1732406400-y'"],
        );
    }

    #[test]
    fn inserts_without_the_column_get_it_from_the_key() {
        let e = engine();
        let r = rewrite(
            &e,
            &format!("INSERT INTO Messages (UUID, Message) VALUES ({K}, '{{}}'), ('x', '[]')"),
        );
        let spec: Vec<PartitionSpec> = crate::kinds::entries(RULE, "partition").unwrap();
        let kt = super::super::key_time_sql(&spec[0]);
        let fill = |k: &str| format!("IF({}, {}, NULL)", kt.readable(k), kt.date(k));
        assert_sql(
            &r,
            &[&format!(
                "INSERT INTO Messages (UUID, Message, `Inserted`) VALUES ({K}, '{{}}', {}), ('x', '[]', {})",
                fill(K),
                fill("'x'")
            )],
        );
    }

    #[test]
    fn prepared_lookups_repeat_the_parameter_and_check_it() {
        let e = engine();
        let d = e.decide(
            b"SELECT Message FROM Messages WHERE UUID = ?",
            &StatementContext {
                prepared: true,
                current_db: Some("shop"),
                ..Default::default()
            },
        );
        let Decision::Rewrite(r) = d else {
            panic!("{d:?}")
        };
        let map = r.param_map.unwrap();
        assert!(map.len() > 2 && map.iter().all(|&i| i == 0), "{map:?}");
        assert_eq!(
            r.param_checks,
            [(
                0,
                ParamCheck::String {
                    max_bytes: usize::MAX
                }
            )]
        );
    }
}
