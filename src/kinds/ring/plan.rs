//! The ring rule: "keep the last N rows per key" logs as fixed-size rings.
//!
//! The application appends to a log table it only ever reads the latest N rows of
//! per key. Each insert becomes an upsert of slot `seq % N` of that key's ring, where
//! `seq` is the key's next sequence number, kept in MySQL (a sequence table), so any
//! number of proxies can serve one database. Storage is constant per key and no
//! purge job is needed.
//!
//! | statement | becomes |
//! |---|---|
//! | `INSERT INTO log (k, …) VALUES (v, …)[, (…)]` (also `INSERT … SET`, `REPLACE`, `IGNORE`) | one statement: `INSERT INTO ring (k, …, slot, seq) VALUES (v, …, NULL, NULL)[, …] ON DUPLICATE KEY UPDATE c = IF(VALUES(seq) > seq, VALUES(c), c), …, seq = IF(…)`; the ring table's BEFORE INSERT trigger takes the key's next sequence number and sets `seq` and `slot = seq % N` |
//! | any read of `log` | `log` replaced by `(SELECT <logical columns> FROM ring)`: at most N rows per key, the latest, logical columns only, logical metadata |
//! | `DELETE FROM log WHERE …` | `DELETE FROM ring WHERE …` |
//! | `UPDATE log SET payload … WHERE k = v …` | `UPDATE ring …` |
//! | updates by a non-key condition, of key columns, `INSERT … SELECT`, `ON DUPLICATE KEY UPDATE`, DDL | ERR 1105 naming the rule |
//!
//! The trigger (created by `heatsink migrate`) runs `INSERT INTO seq (k, seq) VALUES
//! (NEW.k, LAST_INSERT_ID(1)) ON DUPLICATE KEY UPDATE seq = LAST_INSERT_ID(seq + 1)`
//! and reads LAST_INSERT_ID() back: `LAST_INSERT_ID(1)` on a key's first insert is
//! deliberate (`VALUES (k, 1)` leaves a stale value), and MariaDB restores the
//! session's LAST_INSERT_ID() when a trigger ends, so the application's value is
//! untouched. One statement in autocommit mode is atomic, holds the key's sequence
//! row only for that statement, and costs one round trip. The guard `VALUES(seq) >
//! seq` (assigned last, since MySQL applies ON DUPLICATE KEY UPDATE assignments left to
//! right) keeps an older sequence from overwriting a newer row.

use std::sync::Arc;

use sqlparser::ast::{
    AssignmentTarget, Delete, Expr, FromTable, Insert, ObjectName, SetExpr, Statement, TableFactor,
    TableObject, Update,
};

use super::merge::RingPieces;
use super::spec::RingSpec;
use crate::kinds::inserts::session_independent;
use crate::kinds::logical::LogicalTable;
use crate::rewrite::shape::{
    check_qualifiers, check_update_qualifiers, column_def_name, ddl_rejection, eq, is_table_ddl,
    is_value, key_equalities, last_ident, mentions_column, parse, replace_reads, requalify,
    target_qualifier, unsupported_clauses,
};
use crate::rewrite::{
    Affected, ColumnPatch, ParamCheck, Plan, PlanContext, Refusal, Reply, Rule, Slot, TableName,
};
use crate::rules::spec::quote;
use crate::wire::resultset::ColumnDef;

/// Column flag: AUTO_INCREMENT.
const AUTO_INCREMENT_FLAG: u16 = 0x0200;

/// Execute-time checks of parameters: (parameter index, check).
type ParamChecks = Vec<(usize, ParamCheck)>;

/// A `[[ring]]` rule, ready to plan statements.
pub struct RingRule {
    /// Rule name from the file.
    name: String,
    /// The logical table, its key columns and its columns.
    logical: LogicalTable,
    /// Ring table as written in the rule.
    ring_table: TableName,
    /// Slot column of the ring table.
    slot_column: String,
    /// Sequence column of the ring and sequence tables.
    seq_column: String,
    /// `mode = "shadow"`: decisions are only counted and logged.
    shadow: bool,
    /// `coalesce = true`: concurrent autocommit inserts may be merged into one write.
    coalesce: bool,
}

impl RingRule {
    /// Builds the rule from a validated spec.
    pub fn new(spec: &RingSpec) -> Result<Self, String> {
        spec.validate()?;
        let table = TableName::parse(&spec.table)?;
        Ok(RingRule {
            name: spec.name.clone(),
            logical: LogicalTable::new(table, spec.key.clone()),
            ring_table: TableName::parse(&spec.ring_table)?,
            slot_column: spec.slot_column.clone(),
            seq_column: spec.seq_column.clone(),
            shadow: spec.mode == crate::rules::spec::Mode::Shadow,
            coalesce: spec.coalesce,
        })
    }

    /// A physical table's SQL name, qualified like the statement's reference to the
    /// logical table when the rule does not name a database.
    fn physical(&self, t: &TableName, logical: &ObjectName) -> String {
        self.logical.physical_sql(t, logical)
    }

    fn plan_read(
        &self,
        stmt: &Statement,
        ctx: &PlanContext<'_>,
        meta: &[ColumnDef],
    ) -> Result<Option<Plan>, Refusal> {
        let cols: Vec<String> = meta.iter().map(|d| quote(&column_def_name(d))).collect();
        let mut stmt = stmt.clone();
        let aliases = replace_reads(&mut stmt, &|n| self.logical.named_by(n, ctx), &|n| {
            Ok(format!(
                "SELECT {} FROM {}",
                cols.join(", "),
                self.physical(&self.ring_table, n)
            ))
        })?;
        if aliases.is_empty() {
            return Ok(None);
        }
        Ok(Some(Plan {
            statements: vec![stmt],
            reply: Reply::Patched(Arc::new(ColumnPatch {
                tables: aliases,
                columns: meta
                    .iter()
                    .map(|d| (column_def_name(d).to_ascii_lowercase(), d.clone()))
                    .collect(),
                flags_from_logical: true,
                materialized: vec![self.ring_table.name.clone()],
                // The ring's primary key is (key…, slot); its AUTO_INCREMENT column has
                // a key of its own.
                keyed: meta
                    .iter()
                    .filter(|d| {
                        self.logical.is_key(&column_def_name(d))
                            || d.flags & AUTO_INCREMENT_FLAG != 0
                    })
                    .map(|d| column_def_name(d).to_ascii_lowercase())
                    .collect(),
                computed: Vec::new(),
                set_flags: Vec::new(),
            })),
            ..Default::default()
        }))
    }

    fn plan_insert(
        &self,
        ins: &Insert,
        stmt: &Statement,
        ctx: &PlanContext<'_>,
        meta: &[ColumnDef],
    ) -> Result<Option<Plan>, Refusal> {
        let TableObject::TableName(name) = &ins.table else {
            return self.plan_read(stmt, ctx, meta);
        };
        if !self.logical.named_by(name, ctx) {
            return self.plan_read(stmt, ctx, meta);
        }
        unsupported_clauses(stmt)?;
        if ins.on.is_some() {
            return Err(Refusal::shape(
                "ON DUPLICATE KEY UPDATE into a ring table cannot be rewritten",
            ));
        }
        let (cols, rows) = self.insert_rows(ins, meta)?;
        // The log's AUTO_INCREMENT column stays AUTO_INCREMENT in the ring, so ids
        // and last_insert_id behave as in the log: generated when left out or given
        // NULL/0, globally increasing, also when a row replaces an older one.
        let ai_column = meta
            .iter()
            .find(|d| d.flags & AUTO_INCREMENT_FLAG != 0)
            .map(column_def_name);
        let ring_sql = self.physical(&self.ring_table, name);
        let (slot, seq) = (quote(&self.slot_column), quote(&self.seq_column));
        let mut ring_cols: Vec<String> = cols.iter().map(|c| quote(c)).collect();
        ring_cols.push(slot);
        ring_cols.push(seq.clone());
        let update = self.upsert_assignments(meta, &seq, ai_column.as_deref());
        let (values, param_checks) = self.value_tuples(&cols, &rows, ctx)?;
        // IGNORE keeps its meaning in the upsert: values the column cannot hold are
        // converted with a warning instead of failing the statement.
        let prefix = format!(
            "INSERT {}INTO {ring_sql} ({}) VALUES ",
            if ins.ignore { "IGNORE " } else { "" },
            ring_cols.join(", ")
        );
        let suffix = format!(" ON DUPLICATE KEY UPDATE {}", update.join(", "));
        let tuples = values.join(", ");
        let statements = parse(&format!("{prefix}{tuples}{suffix}"))?;
        let n = rows.len() as u64;
        // Group commit. Rows whose values could differ when evaluated on another
        // session (LAST_INSERT_ID(), @variables, CONNECTION_ID(), …) or that give the
        // AUTO_INCREMENT column a value of their own are never merged. Prepared
        // statements keep `?` in the pieces; each execute fills in its values.
        // Nor are `INSERT IGNORE`s: a row the server skips (a foreign key, a CHECK,
        // a duplicate) leaves no trace in a merged write's `RETURNING` of whose it was.
        let mergeable = self.coalesce
            && !ins.ignore
            && !ai_column
                .as_deref()
                .is_some_and(|ai| cols.iter().any(|c| eq(c, ai)))
            && rows.iter().flatten().all(session_independent);
        // The pieces serve a merged write, and a multi-row insert into a log with an
        // AUTO_INCREMENT column, which runs with `RETURNING id` to report its first
        // row's id (see `relay::merge`). Other inserts render none.
        let returning = n > 1 && ai_column.is_some();
        let aux = if mergeable || returning {
            let first = &rows[0];
            let order: Vec<String> = self
                .logical
                .key()
                .iter()
                .filter_map(|k| cols.iter().position(|c| eq(c, k)))
                .map(|i| first[i].to_string())
                .collect();
            RingPieces {
                prefix: &prefix,
                tuples: &tuples,
                suffix: &suffix,
                order: &order.join(", "),
                rows: &n.to_string(),
                ai_column: &ai_column.as_deref().map(quote).unwrap_or_default(),
            }
            .to_aux()
        } else {
            Vec::new()
        };
        // The numbering trigger is heatsink's own, on the ring table.
        let merge = (!aux.is_empty()).then(|| {
            super::merge::merger(
                mergeable,
                self.logical.merge_table(&self.ring_table, ctx, true),
            )
        });
        Ok(Some(Plan {
            statements,
            reply: Reply::Ok {
                // IGNORE: a row the server skips (a foreign key, a CHECK) is not
                // written, and not counted.
                affected_rows: if ins.ignore {
                    Affected::WrittenOf { probe: 0, rows: n }
                } else {
                    Affected::Fixed(n)
                },
                info: (n > 1).then(|| format!("Records: {n}  Duplicates: 0  Warnings: 0")),
                last_insert_id: ai_column.is_some().then_some(0),
            },
            atomic: false,
            aux,
            merge,
            param_checks,
            as_sent_on_error: None,
            fallback: None,
            prelude: None,
            plan_flags: None,
        }))
    }

    /// The rows of an `INSERT` into the log as a column list and one value list per
    /// row (`INSERT … SET` gives one row); an error for `INSERT … SELECT`, tuple
    /// assignments and columns the log does not have.
    fn insert_rows(
        &self,
        ins: &Insert,
        meta: &[ColumnDef],
    ) -> Result<(Vec<String>, Vec<Vec<Expr>>), Refusal> {
        let (cols, rows): (Vec<String>, Vec<Vec<Expr>>) = if !ins.assignments.is_empty() {
            let mut cols = Vec::new();
            let mut row = Vec::new();
            for a in &ins.assignments {
                let AssignmentTarget::ColumnName(c) = &a.target else {
                    return Err(Refusal::shape("tuple assignments cannot be rewritten"));
                };
                cols.push(last_ident(c));
                row.push(a.value.clone());
            }
            (cols, vec![row])
        } else {
            let rows = match ins.source.as_deref().map(|q| q.body.as_ref()) {
                Some(SetExpr::Values(v)) => &v.rows,
                _ => {
                    return Err(Refusal::shape("INSERT … SELECT into a ring table cannot be rewritten; insert rows with VALUES"))
                }
            };
            let cols: Vec<String> = if ins.columns.is_empty() {
                meta.iter().map(column_def_name).collect()
            } else {
                ins.columns.iter().map(last_ident).collect()
            };
            (cols, rows.iter().map(|r| r.content.clone()).collect())
        };
        for c in &cols {
            if !meta.iter().any(|d| eq(&column_def_name(d), c)) {
                return Err(Refusal::schema(format!(
                    "table {} has no column `{c}`",
                    self.logical.name()
                )));
            }
        }
        Ok((cols, rows))
    }

    /// The upsert's `ON DUPLICATE KEY UPDATE` assignments: every non-key column of
    /// the log guarded by the sequence column `seq` (quoted), the AUTO_INCREMENT
    /// column through `LAST_INSERT_ID()`, and the sequence column itself last.
    fn upsert_assignments(
        &self,
        meta: &[ColumnDef],
        seq: &str,
        ai_column: Option<&str>,
    ) -> Vec<String> {
        let guarded = |c: &str| format!("IF(VALUES({seq}) > {seq}, VALUES({c}), {c})");
        let mut update: Vec<String> = Vec::with_capacity(meta.len() + 1);
        for c in meta
            .iter()
            .map(column_def_name)
            .filter(|c| !self.logical.is_key(c))
        {
            let q = quote(&c);
            if ai_column.is_some_and(|ai| eq(ai, &c)) {
                update.push(format!("{q} = LAST_INSERT_ID({})", guarded(&q)));
            } else {
                update.push(format!("{q} = {}", guarded(&q)));
            }
        }
        // Sequence last: MySQL applies the assignments left to right, and the guards
        // above must compare with the row's old sequence number.
        update.push(format!("{seq} = {}", guarded(seq)));
        update
    }

    /// One `(v, …, NULL, NULL)` tuple per row, and the execute-time checks of key
    /// parameters; an error for a row of the wrong length or a key column that is
    /// missing, not a value, or NULL.
    fn value_tuples(
        &self,
        cols: &[String],
        rows: &[Vec<Expr>],
        ctx: &PlanContext<'_>,
    ) -> Result<(Vec<String>, ParamChecks), Refusal> {
        let mut values = Vec::with_capacity(rows.len());
        let mut param_checks = Vec::new();
        for row in rows {
            if row.len() != cols.len() {
                return Err(Refusal::shape(
                    "the column list and the VALUES list differ in length",
                ));
            }
            for k in self.logical.key() {
                let v = cols
                    .iter()
                    .position(|c| eq(c, k))
                    .map(|i| &row[i])
                    .ok_or_else(|| {
                        Refusal::shape(format!("the INSERT must give the key column `{k}`"))
                    })?;
                if !is_value(v) {
                    return Err(Refusal::value(format!(
                        "the key column `{k}` must be given a value"
                    )));
                }
                if let Some(Slot::Param(j)) = ctx.slot(v) {
                    // The same for a NULL parameter, found at execute time.
                    param_checks.push((j, ParamCheck::NotNull));
                }
                if matches!(v, Expr::Value(x) if x.value == sqlparser::ast::Value::Null) {
                    // The ring's primary key cannot hold it, and the log's errors for
                    // it (1048, or a conversion error first) cannot be reproduced.
                    return Err(Refusal::value(format!(
                        "a NULL key (`{k}`) cannot be stored in the ring"
                    )));
                }
            }
            // Slot and sequence are assigned by the ring table's BEFORE INSERT
            // trigger (heatsink migrate); NULL makes a missing trigger fail loudly
            // (1048) instead of filling slot 0.
            let mut vals: Vec<String> = row.iter().map(ToString::to_string).collect();
            vals.push("NULL".into());
            vals.push("NULL".into());
            values.push(format!("({})", vals.join(", ")));
        }
        Ok((values, param_checks))
    }

    fn plan_delete(
        &self,
        d: &Delete,
        stmt: &Statement,
        ctx: &PlanContext<'_>,
        meta: &[ColumnDef],
    ) -> Result<Option<Plan>, Refusal> {
        let from = match &d.from {
            FromTable::WithFromKeyword(f) | FromTable::WithoutKeyword(f) => f,
        };
        let ours = from.iter().any(|t| {
            self.logical.is_factor(&t.relation, ctx)
                || t.joins
                    .iter()
                    .any(|j| self.logical.is_factor(&j.relation, ctx))
        });
        if !ours {
            return self.plan_read(stmt, ctx, meta);
        }
        unsupported_clauses(stmt)?;
        let multi = !d.tables.is_empty()
            || d.using.is_some()
            || from.len() != 1
            || from.iter().any(|t| !t.joins.is_empty());
        if multi {
            return Err(Refusal::shape(format!(
                "a multi-table DELETE involving ring table {} cannot be rewritten",
                self.logical.name()
            )));
        }
        let TableFactor::Table { name, .. } = &from[0].relation else {
            return Err(Refusal::shape("unexpected DELETE target"));
        };
        if let Some((q, alias)) = target_qualifier(&from[0].relation) {
            check_qualifiers(d.selection.iter(), &q, alias)?;
        }
        // A ring refills its slots in sequence order: deleting some of a key's rows
        // leaves a hole the next insert does not fill (it replaces the oldest live
        // row), where the table would keep that row. Whole keys and whole tables
        // can be deleted exactly.
        let whole = match &d.selection {
            None => true,
            Some(w) => {
                !self.logical.key().is_empty()
                    && key_equalities(self.logical.key(), Some(w)).is_some()
            }
        };
        if !whole || d.limit.is_some() {
            return Err(Refusal::shape(format!(
                "deleting some of a key's rows from ring table {} cannot be rewritten (later inserts would replace a row the table keeps); delete whole keys with `{}`",
                self.logical.name(),
                self.logical.key()
                    .iter()
                    .map(|k| format!("{k} = value"))
                    .collect::<Vec<_>>()
                    .join(" AND ")
            )));
        }
        let mut sql = format!("DELETE FROM {}", self.physical(&self.ring_table, name));
        let is_column = |c: &str| meta.iter().any(|d| eq(&column_def_name(d), c));
        if let Some(w) = &d.selection {
            let w = requalify(w, is_column)
                .map_err(|r| r.map_reason(|what| format!("the WHERE condition uses {what}")))?;
            sql.push_str(&format!(" WHERE {w}"));
        }
        self.append_order_limit(&mut sql, &d.order_by, d.limit.as_ref(), is_column)?;
        Ok(Some(Plan {
            statements: parse(&sql)?,
            ..Default::default()
        }))
    }

    fn append_order_limit(
        &self,
        sql: &mut String,
        order_by: &[sqlparser::ast::OrderByExpr],
        limit: Option<&Expr>,
        is_column: impl Fn(&str) -> bool + Copy,
    ) -> Result<(), Refusal> {
        if !order_by.is_empty() {
            let mut parts = Vec::new();
            for o in order_by {
                let e = requalify(&o.expr, is_column)
                    .map_err(|r| r.map_reason(|what| format!("ORDER BY uses {what}")))?;
                let mut o = o.clone();
                o.expr = e;
                parts.push(o.to_string());
            }
            sql.push_str(&format!(" ORDER BY {}", parts.join(", ")));
        }
        if let Some(l) = limit {
            sql.push_str(&format!(" LIMIT {l}"));
        }
        Ok(())
    }

    fn plan_update(
        &self,
        u: &Update,
        stmt: &Statement,
        ctx: &PlanContext<'_>,
        meta: &[ColumnDef],
    ) -> Result<Option<Plan>, Refusal> {
        let target = match &u.table.relation {
            TableFactor::Table { name, .. } if self.logical.named_by(name, ctx) => Some(name),
            _ => None,
        };
        let joined = u
            .table
            .joins
            .iter()
            .any(|j| self.logical.is_factor(&j.relation, ctx));
        let Some(name) = target else {
            if joined {
                return Err(Refusal::shape(format!(
                    "a multi-table UPDATE that joins ring table {} cannot be rewritten",
                    self.logical.name()
                )));
            }
            return self.plan_read(stmt, ctx, meta);
        };
        unsupported_clauses(stmt)?;
        if !u.table.joins.is_empty() || u.from.is_some() {
            return Err(Refusal::shape(format!(
                "a multi-table UPDATE of ring table {} cannot be rewritten",
                self.logical.name()
            )));
        }
        check_update_qualifiers(u)?;
        let is_column = |c: &str| meta.iter().any(|d| eq(&column_def_name(d), c));
        let mut sets = Vec::new();
        for a in &u.assignments {
            let AssignmentTarget::ColumnName(col) = &a.target else {
                return Err(Refusal::shape("tuple assignments cannot be rewritten"));
            };
            let col = last_ident(col);
            if self.logical.is_key(&col) {
                return Err(Refusal::shape(format!(
                    "updating the key column `{col}` would move rows between rings; delete and insert instead"
                )));
            }
            let v = requalify(&a.value, is_column)
                .map_err(|r| r.map_reason(|what| format!("SET {col} = … uses {what}")))?;
            sets.push(format!("{} = {v}", quote(&col)));
        }
        let keyed = u.selection.as_ref().is_some_and(|w| {
            let mut terms = Vec::new();
            crate::rewrite::shape::conjuncts(w, &mut terms);
            let key_terms: Vec<&Expr> = terms
                .into_iter()
                .filter(|t| mentions_column(t, |c| self.logical.is_key(c)))
                .collect();
            let cond =
                key_terms
                    .iter()
                    .skip(1)
                    .fold(key_terms.first().map(|e| (*e).clone()), |acc, t| {
                        acc.map(|a| Expr::BinaryOp {
                            left: Box::new(a),
                            op: sqlparser::ast::BinaryOperator::And,
                            right: Box::new((*t).clone()),
                        })
                    });
            !self.logical.key().is_empty()
                && key_equalities(self.logical.key(), cond.as_ref()).is_some()
        });
        if !keyed && !self.logical.key().is_empty() {
            return Err(Refusal::shape(format!(
                "an UPDATE of a ring must select its key with `{}`; updating rows by other conditions cannot be rewritten",
                self.logical.key()
                    .iter()
                    .map(|k| format!("{k} = value"))
                    .collect::<Vec<_>>()
                    .join(" AND ")
            )));
        }
        let mut sql = format!(
            "UPDATE {} SET {}",
            self.physical(&self.ring_table, name),
            sets.join(", ")
        );
        if let Some(w) = &u.selection {
            let w = requalify(w, is_column)
                .map_err(|r| r.map_reason(|what| format!("the WHERE condition uses {what}")))?;
            sql.push_str(&format!(" WHERE {w}"));
        }
        self.append_order_limit(&mut sql, &u.order_by, u.limit.as_ref(), is_column)?;
        Ok(Some(Plan {
            statements: parse(&sql)?,
            ..Default::default()
        }))
    }
}

impl Rule for RingRule {
    fn merges(&self) -> bool {
        self.coalesce
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn tables(&self) -> &[TableName] {
        self.logical.tables()
    }

    fn shadow(&self) -> bool {
        self.shadow
    }

    fn metadata_query(&self, current_db: Option<&str>) -> Option<String> {
        self.logical.metadata_query(current_db)
    }

    fn physical_tables(&self) -> Vec<(String, String)> {
        vec![(
            self.ring_table.name.clone(),
            self.logical.name().name.to_string(),
        )]
    }

    fn provide_metadata(&self, current_db: Option<&str>, columns: &[ColumnDef]) {
        self.logical.provide_metadata(current_db, columns);
    }

    fn plan(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, Refusal> {
        let meta = self.logical.columns(ctx)?;
        for k in self.logical.key() {
            if !meta.iter().any(|d| eq(&column_def_name(d), k)) {
                return Err(Refusal::schema(format!(
                    "table {} has no column `{k}`",
                    self.logical.name()
                )));
            }
        }
        for c in [&self.slot_column, &self.seq_column] {
            if meta.iter().any(|d| eq(&column_def_name(d), c)) {
                return Err(Refusal::schema(format!(
                    "table {} already has a column `{c}`; choose another slot_column/seq_column",
                    self.logical.name()
                )));
            }
        }
        match stmt {
            Statement::Insert(i) => self.plan_insert(i, stmt, ctx, &meta),
            Statement::Update(u) => self.plan_update(u, stmt, ctx, &meta),
            Statement::Delete(d) => self.plan_delete(d, stmt, ctx, &meta),
            Statement::Query(_) => self.plan_read(stmt, ctx, &meta),
            _ if is_table_ddl(stmt) => Err(ddl_rejection(
                stmt,
                "ring",
                self.logical.name(),
                "ring table",
            )),
            _ => self.plan_read(stmt, ctx, &meta),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rewrite::testutil::{assert_sql, col, decide, parsed, reject, rewrite};
    use crate::rewrite::{Decision, Engine, Rewritten};
    use crate::wire::resultset::types;

    /// The rewrite's executions merge (its merger yields a part).
    fn merges(r: &Rewritten) -> bool {
        r.merge.as_ref().is_some_and(|m| m.part(&r.aux).is_some())
    }

    /// An engine with one ring rule (size 5, key uid) on
    /// `log(id AUTO_INCREMENT, uid, visitor_uid, last_update)`.
    fn engine(coalesce: bool) -> Engine {
        let spec: Vec<RingSpec> = crate::kinds::entries(&format!(
            "[[ring]]\nname = \"visits\"\ntable = \"log\"\nkey = [\"uid\"]\nsize = 5\nring_table = \"log_ring\"\nseq_table = \"log_seq\"\ncoalesce = {coalesce}\n"
        ), "ring").unwrap();
        let rule = RingRule::new(&spec[0]).unwrap();
        let e = Engine::new(vec![Arc::new(rule)], 1000).unwrap();
        e.provide_metadata(
            0,
            Some("shop"),
            &[
                col("log", "id", types::LONGLONG, 0x4203 | AUTO_INCREMENT_FLAG),
                col("log", "uid", types::LONG, 0x1009),
                col("log", "visitor_uid", types::LONG, 0x1001),
                col("log", "last_update", types::DATETIME, 0x1081),
            ],
        );
        e
    }

    const GUARDS: &str = "ON DUPLICATE KEY UPDATE `id` = LAST_INSERT_ID(IF(VALUES(`seq`) > `seq`, VALUES(`id`), `id`)), `visitor_uid` = IF(VALUES(`seq`) > `seq`, VALUES(`visitor_uid`), `visitor_uid`), `last_update` = IF(VALUES(`seq`) > `seq`, VALUES(`last_update`), `last_update`), `seq` = IF(VALUES(`seq`) > `seq`, VALUES(`seq`), `seq`)";

    fn upsert(values: &str) -> String {
        format!("INSERT INTO `log_ring` (`uid`, `visitor_uid`, `last_update`, `slot`, `seq`) VALUES {values} {GUARDS}")
    }

    #[test]
    fn refusals_name_their_class() {
        use crate::rewrite::testutil::refusal;
        use crate::rewrite::RefusalClass;
        let e = engine(false);
        for (sql, class) in [
            (
                "INSERT INTO log (uid, visitor_uid) VALUES (NULL, 7)",
                RefusalClass::Value,
            ),
            (
                "INSERT INTO log (uid, visitor_uid) VALUES (1, 7) ON DUPLICATE KEY UPDATE visitor_uid = 8",
                RefusalClass::Shape,
            ),
            ("DROP TABLE log", RefusalClass::Ddl),
        ] {
            let (got, why) = refusal(&e, sql);
            assert_eq!(got, class, "{sql}: {why}");
        }
    }

    #[test]
    fn an_insert_becomes_one_guarded_upsert() {
        let e = engine(false);
        let r = rewrite(
            &e,
            "INSERT INTO log (uid, visitor_uid, last_update) VALUES (5, 7, NOW(6))",
        );
        assert_sql(&r, &[&upsert("(5, 7, NOW(6), NULL, NULL)")]);
        assert_eq!(
            r.reply,
            Reply::Ok {
                affected_rows: Affected::Fixed(1),
                info: None,
                last_insert_id: Some(0),
            }
        );
        assert!(r.merge.is_none());
        // Nothing to merge or return: no pieces rendered per execution.
        assert!(r.aux.is_empty());
        // INSERT … SET, REPLACE and a qualified name: the same upsert.
        for sql in [
            "INSERT INTO log SET uid = 5, visitor_uid = 7, last_update = NOW(6)",
            "REPLACE INTO log (uid, visitor_uid, last_update) VALUES (5, 7, NOW(6))",
        ] {
            assert_sql(&rewrite(&e, sql), &[&upsert("(5, 7, NOW(6), NULL, NULL)")]);
        }
        // IGNORE stays: it turns conversion errors into warnings.
        assert_sql(
            &rewrite(
                &e,
                "INSERT IGNORE INTO log (uid, visitor_uid, last_update) VALUES (5, 7, NOW(6))",
            ),
            &[&upsert("(5, 7, NOW(6), NULL, NULL)").replacen("INSERT", "INSERT IGNORE", 1)],
        );
        assert_sql(
            &rewrite(
                &e,
                "INSERT INTO shop.log (uid, visitor_uid, last_update) VALUES (5, 7, '2026-01-01')",
            ),
            &[
                &upsert("(5, 7, '2026-01-01', NULL, NULL)")
                    .replace("`log_ring`", "shop.`log_ring`"),
            ],
        );
    }

    #[test]
    fn multi_row_inserts_report_their_rows() {
        let e = engine(false);
        let r = rewrite(
            &e,
            "INSERT INTO log (uid, visitor_uid, last_update) VALUES (5, 7, NOW()), (6, 8, NOW())",
        );
        assert_sql(
            &r,
            &[&upsert(
                "(5, 7, NOW(), NULL, NULL), (6, 8, NOW(), NULL, NULL)",
            )],
        );
        assert_eq!(
            r.reply,
            Reply::Ok {
                affected_rows: Affected::Fixed(2),
                info: Some("Records: 2  Duplicates: 0  Warnings: 0".into()),
                last_insert_id: Some(0),
            }
        );
        // Pieces for running it with `RETURNING id`, though it does not merge.
        assert!(!merges(&r));
        assert_eq!(r.aux.len(), 6);
        assert_eq!(r.aux[5], b"`id`");
    }

    #[test]
    fn reads_deletes_and_keyed_updates_go_to_the_ring() {
        let e = engine(false);
        let r = rewrite(&e, "SELECT * FROM log WHERE uid = 5 ORDER BY id DESC");
        assert_sql(
            &r,
            &["SELECT * FROM (SELECT `id`, `uid`, `visitor_uid`, `last_update` FROM `log_ring`) AS log WHERE uid = 5 ORDER BY id DESC"],
        );
        assert!(matches!(r.reply, Reply::Patched(_)));
        assert_sql(
            &rewrite(&e, "DELETE FROM log WHERE uid = 5"),
            &["DELETE FROM `log_ring` WHERE uid = 5"],
        );
        assert_sql(
            &rewrite(&e, "UPDATE log SET visitor_uid = 1 WHERE uid = 5"),
            &["UPDATE `log_ring` SET `visitor_uid` = 1 WHERE uid = 5"],
        );
    }

    #[test]
    fn unfaithful_shapes_are_rejected_naming_the_rule() {
        let e = engine(false);
        for (sql, why) in [
            ("UPDATE log SET visitor_uid = 1 WHERE visitor_uid = 3", "must select its key"),
            ("UPDATE log SET uid = 1 WHERE uid = 5", "key column `uid`"),
            ("INSERT INTO log (uid, visitor_uid, last_update) SELECT 1, 2, NOW()", "INSERT … SELECT"),
            ("INSERT INTO log (uid, visitor_uid, last_update) VALUES (1, 2, NOW()) ON DUPLICATE KEY UPDATE visitor_uid = 3", "ON DUPLICATE KEY UPDATE"),
            ("INSERT INTO log (visitor_uid, last_update) VALUES (2, NOW())", "key column `uid`"),
            ("INSERT INTO log (uid, nope) VALUES (1, 2)", "no column `nope`"),
            ("ALTER TABLE log ADD COLUMN x INT", "visits"),
            ("DELETE l FROM log l JOIN log m ON l.uid = m.uid", "multi-table DELETE"),
        ] {
            let msg = reject(&e, sql);
            assert!(msg.starts_with("heatsink rule 'visits': "), "{sql}: {msg}");
            assert!(msg.contains(why), "{sql}: {msg}");
        }
    }

    #[test]
    fn coalesced_inserts_carry_their_merge_pieces() {
        let e = engine(true);
        let r = rewrite(
            &e,
            "INSERT INTO log (visitor_uid, uid, last_update) VALUES (7, 5, NOW(6)), (8, 6, NOW(6))",
        );
        assert!(merges(&r));
        let aux: Vec<String> = r
            .aux
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        // prefix + tuples + suffix is the statement itself.
        assert_eq!(
            parsed(&[format!("{}{}{}", aux[0], aux[1], aux[2])]),
            parsed(&r.statements)
        );
        assert_eq!(&aux[3..], ["5", "2", "`id`"]);
        // Values a leader's session could evaluate differently, or an id of the
        // row's own: never merged.
        for sql in [
            "INSERT INTO log (uid, visitor_uid, last_update) VALUES (5, LAST_INSERT_ID(), NOW())",
            "INSERT INTO log (uid, visitor_uid, last_update) VALUES (5, @v, NOW())",
            "INSERT INTO log (uid, visitor_uid, last_update) VALUES (5, CONNECTION_ID(), NOW())",
            "INSERT INTO log (id, uid, visitor_uid, last_update) VALUES (NULL, 5, 7, NOW())",
        ] {
            assert!(!merges(&rewrite(&e, sql)), "{sql}");
        }
        match decide(
            &e,
            "INSERT INTO log (uid, visitor_uid, last_update) VALUES (5, 1, UTC_TIMESTAMP())",
        ) {
            Decision::Rewrite(r) => assert!(merges(&r)),
            other => panic!("{other:?}"),
        }
        // Prepared: the pieces keep `?`, and say where each parameter goes.
        let r = match crate::rewrite::testutil::decide_prepared(
            &e,
            "INSERT INTO log (visitor_uid, uid, last_update) VALUES (?, ?, NOW(6))",
        ) {
            Decision::Rewrite(r) => r,
            other => panic!("{other:?}"),
        };
        assert!(merges(&r));
        assert_eq!(r.aux[1], b"(?, ?, NOW(6), NULL, NULL)");
        assert_eq!(r.aux[3], b"?");
        assert_eq!(r.aux_holes[1], vec![(1, 0), (4, 1)]);
        assert_eq!(r.aux_holes[3], vec![(0, 1)]);
        assert!(r.aux_holes[0].is_empty() && r.aux_holes[2].is_empty());
    }
}
