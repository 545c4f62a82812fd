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

use super::shape::{
    column_def_name, ddl_rejection, eq, is_table_ddl, is_value, key_equalities, last_ident,
    mentions_column, parse, replace_reads, requalify, ColumnsByDb,
};
use super::{Affected, ColumnPatch, Plan, PlanContext, Reply, Rule, TableName};
use crate::rules::spec::{quote, RingSpec, TableName as SpecTable};
use crate::wire::resultset::ColumnDef;

/// Column flag: AUTO_INCREMENT.
const AUTO_INCREMENT_FLAG: u16 = 0x0200;

/// A `[[ring]]` rule, ready to plan statements.
pub struct RingRule {
    /// Rule name from the file.
    name: String,
    /// The logical table (one entry).
    tables: Vec<TableName>,
    /// Ring table as written in the rule.
    ring_table: SpecTable,
    /// Key columns.
    key: Vec<String>,
    /// Slot column of the ring table.
    slot_column: String,
    /// Sequence column of the ring and sequence tables.
    seq_column: String,
    /// `mode = "shadow"`: decisions are only counted and logged.
    shadow: bool,
    /// The logical table's columns, learned once per database.
    meta: ColumnsByDb,
}

impl RingRule {
    /// Builds the rule from a validated spec.
    pub fn new(spec: &RingSpec) -> Result<Self, String> {
        spec.validate()?;
        let table = SpecTable::parse(&spec.table)?;
        let logical = TableName::new(table.db.as_deref(), &table.name);
        Ok(RingRule {
            name: spec.name.clone(),
            tables: vec![logical.clone()],
            ring_table: SpecTable::parse(&spec.ring_table)?,
            key: spec.key.clone(),
            slot_column: spec.slot_column.clone(),
            seq_column: spec.seq_column.clone(),
            shadow: spec.mode == crate::rules::spec::Mode::Shadow,
            meta: ColumnsByDb::new(logical),
        })
    }

    fn is_key(&self, col: &str) -> bool {
        self.key.iter().any(|k| eq(k, col))
    }

    fn names_ours(&self, name: &ObjectName, ctx: &PlanContext<'_>) -> bool {
        ctx.names_table(name, &self.tables[0])
    }

    fn factor_is_ours(&self, f: &TableFactor, ctx: &PlanContext<'_>) -> bool {
        matches!(f, TableFactor::Table { name, .. } if self.names_ours(name, ctx))
    }

    /// A physical table's SQL name, qualified like the statement's reference to the
    /// logical table when the rule does not name a database.
    fn physical(&self, t: &SpecTable, logical: &ObjectName) -> String {
        if t.db.is_some() || logical.0.len() < 2 {
            return t.quoted();
        }
        format!("{}.{}", logical.0[0], quote(&t.name))
    }

    fn plan_read(
        &self,
        stmt: &Statement,
        ctx: &PlanContext<'_>,
        meta: &[ColumnDef],
    ) -> Result<Option<Plan>, String> {
        let cols: Vec<String> = meta.iter().map(|d| quote(&column_def_name(d))).collect();
        let mut stmt = stmt.clone();
        let mut aliases = replace_reads(&mut stmt, &|n| self.names_ours(n, ctx), &|n| {
            Ok(format!(
                "SELECT {} FROM {}",
                cols.join(", "),
                self.physical(&self.ring_table, n)
            ))
        })?;
        if aliases.is_empty() {
            return Ok(None);
        }
        // Merged into the outer query, the derived table's columns report the ring
        // table as their origin.
        aliases.push(self.ring_table.name.clone());
        Ok(Some(Plan {
            statements: vec![stmt],
            reply: Reply::Patched(Arc::new(ColumnPatch {
                tables: aliases,
                columns: meta
                    .iter()
                    .map(|d| (column_def_name(d).to_ascii_lowercase(), d.clone()))
                    .collect(),
                flags_from_logical: true,
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
    ) -> Result<Option<Plan>, String> {
        let TableObject::TableName(name) = &ins.table else {
            return self.plan_read(stmt, ctx, meta);
        };
        if !self.names_ours(name, ctx) {
            return self.plan_read(stmt, ctx, meta);
        }
        if ins.on.is_some() {
            return Err("ON DUPLICATE KEY UPDATE into a ring table cannot be rewritten".into());
        }
        // Rows as (column, value) lists.
        let (cols, rows): (Vec<String>, Vec<Vec<Expr>>) = if !ins.assignments.is_empty() {
            let mut cols = Vec::new();
            let mut row = Vec::new();
            for a in &ins.assignments {
                let AssignmentTarget::ColumnName(c) = &a.target else {
                    return Err("tuple assignments cannot be rewritten".into());
                };
                cols.push(last_ident(c));
                row.push(a.value.clone());
            }
            (cols, vec![row])
        } else {
            let rows = match ins.source.as_deref().map(|q| q.body.as_ref()) {
                Some(SetExpr::Values(v)) => &v.rows,
                _ => {
                    return Err("INSERT … SELECT into a ring table cannot be rewritten; insert rows with VALUES".into())
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
                return Err(format!("table {} has no column `{c}`", self.tables[0]));
            }
        }
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
        let guarded = |c: &str| format!("IF(VALUES({seq}) > {seq}, VALUES({c}), {c})");
        let mut update: Vec<String> = Vec::with_capacity(meta.len() + 1);
        for c in meta.iter().map(column_def_name).filter(|c| !self.is_key(c)) {
            let q = quote(&c);
            if ai_column.as_deref().is_some_and(|ai| eq(ai, &c)) {
                update.push(format!("{q} = LAST_INSERT_ID({})", guarded(&q)));
            } else {
                update.push(format!("{q} = {}", guarded(&q)));
            }
        }
        // Sequence last: MySQL applies the assignments left to right, and the guards
        // above must compare with the row's old sequence number.
        update.push(format!("{seq} = {}", guarded(&seq)));
        let mut values = Vec::with_capacity(rows.len());
        for row in &rows {
            if row.len() != cols.len() {
                return Err("the column list and the VALUES list differ in length".into());
            }
            for k in &self.key {
                let v = cols
                    .iter()
                    .position(|c| eq(c, k))
                    .map(|i| &row[i])
                    .ok_or_else(|| format!("the INSERT must give the key column `{k}`"))?;
                if !is_value(v) {
                    return Err(format!("the key column `{k}` must be given a value"));
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
        let statements = parse(&format!(
            "INSERT INTO {ring_sql} ({}) VALUES {} ON DUPLICATE KEY UPDATE {}",
            ring_cols.join(", "),
            values.join(", "),
            update.join(", ")
        ))?;
        let n = rows.len() as u64;
        Ok(Some(Plan {
            statements,
            reply: Reply::Ok {
                affected_rows: Affected::Fixed(n),
                info: (n > 1).then(|| format!("Records: {n}  Duplicates: 0  Warnings: 0")),
                last_insert_id: ai_column.is_some().then_some(0),
            },
            atomic: false,
            ..Default::default()
        }))
    }

    fn plan_delete(
        &self,
        d: &Delete,
        stmt: &Statement,
        ctx: &PlanContext<'_>,
        meta: &[ColumnDef],
    ) -> Result<Option<Plan>, String> {
        let from = match &d.from {
            FromTable::WithFromKeyword(f) | FromTable::WithoutKeyword(f) => f,
        };
        let ours = from.iter().any(|t| {
            self.factor_is_ours(&t.relation, ctx)
                || t.joins
                    .iter()
                    .any(|j| self.factor_is_ours(&j.relation, ctx))
        });
        if !ours {
            return self.plan_read(stmt, ctx, meta);
        }
        let multi = !d.tables.is_empty()
            || d.using.is_some()
            || from.len() != 1
            || from.iter().any(|t| !t.joins.is_empty());
        if multi {
            return Err(format!(
                "a multi-table DELETE involving ring table {} cannot be rewritten",
                self.tables[0]
            ));
        }
        let TableFactor::Table { name, .. } = &from[0].relation else {
            return Err("unexpected DELETE target".into());
        };
        let mut sql = format!("DELETE FROM {}", self.physical(&self.ring_table, name));
        let is_column = |c: &str| meta.iter().any(|d| eq(&column_def_name(d), c));
        if let Some(w) = &d.selection {
            let w = requalify(w, is_column)
                .map_err(|what| format!("the WHERE condition uses {what}"))?;
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
    ) -> Result<(), String> {
        if !order_by.is_empty() {
            let mut parts = Vec::new();
            for o in order_by {
                let e = requalify(&o.expr, is_column)
                    .map_err(|what| format!("ORDER BY uses {what}"))?;
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
    ) -> Result<Option<Plan>, String> {
        let target = match &u.table.relation {
            TableFactor::Table { name, .. } if self.names_ours(name, ctx) => Some(name),
            _ => None,
        };
        let joined = u
            .table
            .joins
            .iter()
            .any(|j| self.factor_is_ours(&j.relation, ctx));
        let Some(name) = target else {
            if joined {
                return Err(format!(
                    "a multi-table UPDATE that joins ring table {} cannot be rewritten",
                    self.tables[0]
                ));
            }
            return self.plan_read(stmt, ctx, meta);
        };
        if !u.table.joins.is_empty() || u.from.is_some() {
            return Err(format!(
                "a multi-table UPDATE of ring table {} cannot be rewritten",
                self.tables[0]
            ));
        }
        let is_column = |c: &str| meta.iter().any(|d| eq(&column_def_name(d), c));
        let mut sets = Vec::new();
        for a in &u.assignments {
            let AssignmentTarget::ColumnName(col) = &a.target else {
                return Err("tuple assignments cannot be rewritten".into());
            };
            let col = last_ident(col);
            if self.is_key(&col) {
                return Err(format!(
                    "updating the key column `{col}` would move rows between rings; delete and insert instead"
                ));
            }
            let v = requalify(&a.value, is_column)
                .map_err(|what| format!("SET {col} = … uses {what}"))?;
            sets.push(format!("{} = {v}", quote(&col)));
        }
        let keyed = u.selection.as_ref().is_some_and(|w| {
            let mut terms = Vec::new();
            super::shape::conjuncts(w, &mut terms);
            let key_terms: Vec<&Expr> = terms
                .into_iter()
                .filter(|t| mentions_column(t, |c| self.is_key(c)))
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
            !self.key.is_empty() && key_equalities(&self.key, cond.as_ref()).is_some()
        });
        if !keyed && !self.key.is_empty() {
            return Err(format!(
                "an UPDATE of a ring must select its key with `{}`; updating rows by other conditions cannot be rewritten",
                self.key
                    .iter()
                    .map(|k| format!("{k} = value"))
                    .collect::<Vec<_>>()
                    .join(" AND ")
            ));
        }
        let mut sql = format!(
            "UPDATE {} SET {}",
            self.physical(&self.ring_table, name),
            sets.join(", ")
        );
        if let Some(w) = &u.selection {
            let w = requalify(w, is_column)
                .map_err(|what| format!("the WHERE condition uses {what}"))?;
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
    fn name(&self) -> &str {
        &self.name
    }

    fn tables(&self) -> &[TableName] {
        &self.tables
    }

    fn shadow(&self) -> bool {
        self.shadow
    }

    fn metadata_query(&self, current_db: Option<&str>) -> Option<String> {
        self.meta.query(current_db)
    }

    fn provide_metadata(&self, current_db: Option<&str>, columns: &[ColumnDef]) {
        self.meta.provide(current_db, columns);
    }

    fn plan(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, String> {
        let meta = self.meta.get(ctx.current_db)?;
        for k in &self.key {
            if !meta.iter().any(|d| eq(&column_def_name(d), k)) {
                return Err(format!("table {} has no column `{k}`", self.tables[0]));
            }
        }
        for c in [&self.slot_column, &self.seq_column] {
            if meta.iter().any(|d| eq(&column_def_name(d), c)) {
                return Err(format!(
                    "table {} already has a column `{c}`; choose another slot_column/seq_column",
                    self.tables[0]
                ));
            }
        }
        match stmt {
            Statement::Insert(i) => self.plan_insert(i, stmt, ctx, &meta),
            Statement::Update(u) => self.plan_update(u, stmt, ctx, &meta),
            Statement::Delete(d) => self.plan_delete(d, stmt, ctx, &meta),
            Statement::Query(_) => self.plan_read(stmt, ctx, &meta),
            _ if is_table_ddl(stmt) => {
                Err(ddl_rejection(stmt, "ring", &self.tables[0], "ring table"))
            }
            _ => self.plan_read(stmt, ctx, &meta),
        }
    }
}
