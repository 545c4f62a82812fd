//! The counter rule: hot counters spread over slot rows, summed on read.
//!
//! The logical table keeps every row and stays the counter's *base* value; the slot
//! table holds deltas, one row per (key, slot). The logical value of a counter is
//! `base + SUM(slot deltas)`. Switching the rule on therefore needs no data
//! migration, and several proxies — some with the rule on, some still off — can
//! write at the same time without losing an increment: the ones with the rule off
//! increment the base, the others a slot.
//!
//! | statement | becomes |
//! |---|---|
//! | `UPDATE t SET c = c + n WHERE key = v` | `INSERT INTO slots (key, slot, c) VALUES (v, <random>, n) ON DUPLICATE KEY UPDATE c = c + VALUES(c)`; the client sees the UPDATE's OK (1 row matched and changed); when the upsert fails with a data or constraint error (most often: the table refuses the row the slot trigger creates for a key without one) the UPDATE runs as sent (`Plan::as_sent_on_error`) |
//! | `UPDATE t SET c = v WHERE key = …` | `UPDATE t …` then `DELETE FROM slots WHERE key = …`, atomically |
//! | `DELETE FROM t WHERE key = …` | `DELETE FROM t …` then `DELETE FROM slots WHERE key = …`, atomically |
//! | `INSERT INTO t (key, c) VALUES (v, n) ON DUPLICATE KEY UPDATE c = c + n` | `INSERT IGNORE INTO t (key, c) VALUES (v, 0)`, then (when that found a row, and the row has other columns than the key and the counters) `INSERT IGNORE` of the key alone, then the slot upsert, atomically; affected rows 1 or 2 as the original; undone and run as sent when the probes warn about anything but the key's duplicate (a value MariaDB converts, a foreign key, a CHECK, another unique key: `relay::splice`'s `Probed`) |
//! | any read of `t` | `t` replaced by a derived table computing `base + SUM(slots)` per row; MariaDB merges it, so point lookups use both primary keys; column metadata restored |
//! | plain `INSERT`, updates of other columns | unchanged |
//! | anything else that writes the counter or filters on it | ERR 1105 naming the rule |
//!
//! An increment of a key that has no row yet lands in a slot row; the slot table's
//! trigger (created by `heatsink migrate`) creates the logical row, so the key then
//! exists with base 0, or fails the upsert when the table refuses that row (the
//! UPDATE then runs as sent and matches nothing). Without the trigger such
//! increments stay invisible to reads until the row is inserted.

use std::ops::ControlFlow;
use std::sync::Arc;

use sqlparser::ast::{
    Assignment, AssignmentTarget, BinaryOperator, Delete, Expr, FromTable, Insert, ObjectName,
    OnInsert, Query, SetExpr, Statement, TableFactor, TableObject, UnaryOperator, Update,
};

use super::merge::{IncrementPieces, Increments};
use super::spec::CounterSpec;
use crate::kinds::logical::LogicalTable;
use crate::rewrite::shape::{
    check_qualifiers, check_update_qualifiers, column_name, ddl_rejection, eq, is_table_ddl,
    is_value, key_equalities, last_ident, mentions_column, parse, replace_reads, requalify,
    target_qualifier, unsupported_clauses,
};
use crate::rewrite::{
    Affected, ColumnPatch, LiteralClass, ParamCheck, Plan, PlanContext, Refusal, Reply, Rule, Slot,
    TableName,
};
use crate::rules::spec::quote;
use crate::wire::resultset::{types, ColumnDef, UNSIGNED_FLAG};

/// Counter increments: (column, delta) pairs.
type ColumnDeltas = Vec<(String, Expr)>;

/// Execute-time checks of parameters: (parameter index, check).
type ParamChecks = Vec<(usize, ParamCheck)>;

/// A `[[counter]]` rule, ready to plan statements.
pub struct CounterRule {
    /// Rule name from the file.
    name: String,
    /// The logical table, its key columns and its columns.
    logical: LogicalTable,
    /// Slot table as written in the rule (`db.t` or `t`).
    slot_table: TableName,
    /// Counter columns.
    columns: Vec<String>,
    /// Slot number column.
    slot_column: String,
    /// Slot rows per counter.
    slots: u32,
    /// Concurrent autocommit increments of one counter may be merged.
    coalesce: bool,
    /// `mode = "shadow"`: decisions are only counted and logged.
    shadow: bool,
    /// `drain = true`: increments go to the logical table unchanged (reads, sets
    /// and deletes as usual), so that no slot row is written any more.
    drain: bool,
}

impl CounterRule {
    /// Builds the rule from a validated spec.
    pub fn new(spec: &CounterSpec) -> Result<Self, String> {
        spec.validate()?;
        let table = TableName::parse(&spec.table)?;
        Ok(CounterRule {
            name: spec.name.clone(),
            logical: LogicalTable::new(table, spec.key.clone()),
            slot_table: TableName::parse(&spec.slot_table)?,
            columns: spec.columns.clone(),
            slot_column: spec.slot_column.clone(),
            slots: spec.slots,
            coalesce: spec.coalesce,
            shadow: spec.mode == crate::rules::spec::Mode::Shadow,
            drain: spec.drain,
        })
    }

    fn is_counter(&self, col: &str) -> bool {
        self.columns.iter().any(|c| eq(c, col))
    }

    /// The slot table's SQL name, qualified like the statement's reference to the
    /// logical table when the rule does not name a database.
    fn slot_sql(&self, logical: &ObjectName) -> String {
        self.logical.physical_sql(&self.slot_table, logical)
    }

    /// `SELECT … FROM <logical> h` computing each counter as base + SUM(slots).
    fn derived_sql(&self, logical: &ObjectName, meta: &[ColumnDef]) -> Result<String, Refusal> {
        let slot = self.slot_sql(logical);
        let join: Vec<String> = self
            .logical
            .key()
            .iter()
            .map(|k| format!("`hs_s`.{0} = `hs_h`.{0}", quote(k)))
            .collect();
        let mut select = Vec::with_capacity(meta.len());
        for def in meta {
            let col = String::from_utf8_lossy(&def.org_name).into_owned();
            if self.is_counter(&col) {
                let cast = if def.flags & UNSIGNED_FLAG != 0 {
                    "UNSIGNED"
                } else {
                    "SIGNED"
                };
                let filter = if join.is_empty() {
                    String::new()
                } else {
                    format!(" WHERE {}", join.join(" AND "))
                };
                select.push(format!(
                    "CAST(`hs_h`.{c} + COALESCE((SELECT SUM(`hs_s`.{c}) FROM {slot} AS `hs_s`{filter}), 0) AS {cast}) AS {c}",
                    c = quote(&col)
                ));
            } else {
                select.push(format!("`hs_h`.{}", quote(&col)));
            }
        }
        Ok(format!(
            "SELECT {} FROM {logical} AS `hs_h`",
            select.join(", ")
        ))
    }

    /// Replaces every read of the logical table by the derived table. `Ok(None)` when
    /// the statement does not read it as a table.
    fn plan_read(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, Refusal> {
        let meta = self.logical.columns(ctx)?;
        let meta = meta.as_slice();
        let mut stmt = stmt.clone();
        let aliases = replace_reads(&mut stmt, &|n| self.logical.named_by(n, ctx), &|n| {
            self.derived_sql(n, meta)
        })?;
        if aliases.is_empty() {
            return Ok(None);
        }
        let columns = meta
            .iter()
            .map(|d| {
                (
                    String::from_utf8_lossy(&d.org_name).to_ascii_lowercase(),
                    d.clone(),
                )
            })
            .collect();
        Ok(Some(Plan {
            statements: vec![stmt],
            reply: Reply::Patched(Arc::new(ColumnPatch {
                tables: aliases,
                columns,
                flags_from_logical: false,
                materialized: Vec::new(),
                keyed: Vec::new(),
                computed: Vec::new(),
                set_flags: Vec::new(),
            })),
            atomic: false,
            ..Default::default()
        }))
    }

    fn plan_update(
        &self,
        u: &Update,
        stmt: &Statement,
        ctx: &PlanContext<'_>,
    ) -> Result<Option<Plan>, Refusal> {
        let target = match &u.table.relation {
            TableFactor::Table { name, .. } if self.logical.named_by(name, ctx) => Some(name),
            _ => None,
        };
        let in_joins = u
            .table
            .joins
            .iter()
            .any(|j| self.logical.is_factor(&j.relation, ctx))
            || u.from.is_some();
        let Some(name) = target else {
            if in_joins
                && u.table
                    .joins
                    .iter()
                    .any(|j| self.logical.is_factor(&j.relation, ctx))
            {
                return Err(Refusal::shape(format!(
                    "a multi-table UPDATE that joins counter table {} cannot be rewritten",
                    self.logical.name()
                )));
            }
            return self.plan_read(stmt, ctx);
        };
        unsupported_clauses(stmt)?;
        if !u.table.joins.is_empty() || u.from.is_some() {
            return Err(Refusal::shape(format!(
                "a multi-table UPDATE of counter table {} cannot be rewritten",
                self.logical.name()
            )));
        }
        check_update_qualifiers(u)?;
        let (increments, sets, others) = self.sort_assignments(u)?;
        if let Some(w) = &u.selection {
            if self.mentions_counter(w) {
                return Err(Refusal::shape("a WHERE condition on a counter column cannot be rewritten (the stored value is only the base)"));
            }
        }
        if u.order_by.iter().any(|o| self.mentions_counter(&o.expr)) {
            return Err(Refusal::shape(
                "ORDER BY a counter column cannot be rewritten",
            ));
        }
        if increments.is_empty() && sets == 0 {
            return Ok(None);
        }
        if !increments.is_empty() {
            if sets > 0 || others > 0 {
                return Err(Refusal::shape(
                    "an UPDATE that increments a counter may not also set other columns",
                ));
            }
            if self.drain {
                // The base takes the increment; reads still add the slot rows.
                return Ok(None);
            }
            let Some((increments, keys, param_checks)) =
                self.check_increment(u, ctx, increments)?
            else {
                // MariaDB matches no row: the statement itself changes nothing on
                // the logical table and gives the UPDATE's own answer.
                return Ok(Some(Plan {
                    statements: vec![stmt.clone()],
                    reply: Reply::OkOf(0),
                    ..Default::default()
                }));
            };
            let slot = ctx.random_below(self.slots).to_string();
            let sql = self.upsert_sql(name, &keys, &slot, &increments);
            // Group commit: merged executions rebuild the upsert from these pieces
            // with the summed deltas (text protocol only: parameters have no value
            // at plan time).
            let (aux, merge) = if self.coalesce && !ctx.prepared {
                (
                    self.merge_pieces(name, &keys, &slot, &increments),
                    // The slot trigger (heatsink's own) exists when the counter
                    // has key columns.
                    Some(Increments::merger(self.logical.merge_table(
                        &self.slot_table,
                        ctx,
                        !self.logical.key().is_empty(),
                    ))),
                )
            } else {
                (Vec::new(), None)
            };
            return Ok(Some(Plan {
                statements: parse(&sql)?,
                reply: Reply::Ok {
                    affected_rows: Affected::Fixed(1),
                    info: Some("Rows matched: 1  Changed: 1  Warnings: 0".into()),
                    last_insert_id: None,
                },
                atomic: false,
                aux,
                merge,
                param_checks,
                fallback: None,
                prelude: None,
                plan_flags: None,
                // The upsert may fail where the UPDATE would not: the slot trigger
                // creates the row of a key without one, which the table may refuse
                // (the UPDATE then matches no row and changes nothing).
                as_sent_on_error: Some(crate::rewrite::INCREMENT_DECLINED),
            }));
        }
        // Absolute set: the base takes the value, the slots are cleared.
        if u.limit.is_some() || !u.order_by.is_empty() {
            return Err(Refusal::shape(
                "setting a counter with ORDER BY or LIMIT cannot be rewritten",
            ));
        }
        self.check_sets_every_counter(u)?;
        self.clear_slots_then(name, u.selection.as_ref(), stmt)
    }

    /// Clears the slots of the keys `selection` picks, then runs `stmt` on the base,
    /// atomically; the client sees `stmt`'s OK. Slots first, then the base:
    /// increments lock a slot row and then (through the trigger, for a new slot row)
    /// the base row; the same order here keeps the two from deadlocking.
    fn clear_slots_then(
        &self,
        name: &ObjectName,
        selection: Option<&Expr>,
        stmt: &Statement,
    ) -> Result<Option<Plan>, Refusal> {
        let clear = self.clear_slots_sql(name, selection)?;
        let mut statements = parse(&clear)?;
        statements.push(stmt.clone());
        Ok(Some(Plan {
            statements,
            reply: Reply::OkOf(1),
            atomic: true,
            ..Default::default()
        }))
    }

    /// Sorts an UPDATE's assignments into counter increments `(column, delta)`, the
    /// number of counters set to a value, and the number of other columns assigned;
    /// an error for tuple assignments, other counter expressions, and other columns
    /// assigned from a counter.
    fn sort_assignments(&self, u: &Update) -> Result<(ColumnDeltas, usize, usize), Refusal> {
        let mut increments = Vec::new();
        let mut sets = 0usize;
        let mut others = 0usize;
        for a in &u.assignments {
            let AssignmentTarget::ColumnName(col) = &a.target else {
                return Err(Refusal::shape("tuple assignments cannot be rewritten"));
            };
            let col = last_ident(col);
            if !self.is_counter(&col) {
                others += 1;
                if self.mentions_counter(&a.value) {
                    return Err(Refusal::shape(format!("`{col}` is assigned from a counter column, which this rule keeps in slot rows")));
                }
                continue;
            }
            match increment_of(&col, &a.value) {
                Some(delta) => increments.push((col, delta)),
                None if is_value(&a.value) => sets += 1,
                None => {
                    return Err(Refusal::shape(format!(
                        "SET {col} = {} cannot be rewritten: a counter can only be incremented (`{col} = {col} + n`, `{col} = {col} - n`) or set to a value",
                        a.value
                    )))
                }
            }
        }
        Ok((increments, sets, others))
    }

    /// An absolute set clears the key's slot rows, which hold the increments of every
    /// counter column of the rule: refused unless it sets them all (the others'
    /// increments would be lost).
    fn check_sets_every_counter(&self, u: &Update) -> Result<(), Refusal> {
        let assigned: Vec<String> = u
            .assignments
            .iter()
            .filter_map(|a| match &a.target {
                AssignmentTarget::ColumnName(c) => Some(last_ident(c)),
                _ => None,
            })
            .collect();
        let missing: Vec<&str> = self
            .columns
            .iter()
            .filter(|c| !assigned.iter().any(|a| eq(a, c)))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(Refusal::shape(format!(
            "an UPDATE that sets a counter must set every counter column of the rule: the \
             slot rows it clears also hold the increments of {}",
            missing
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    /// Checks an increment-only UPDATE: its deltas (combined per column), its
    /// `key = value` condition and its LIMIT. Gives the combined increments, the key
    /// values and the execute-time parameter checks, or `None` when MariaDB would
    /// match no row.
    fn check_increment(
        &self,
        u: &Update,
        ctx: &PlanContext<'_>,
        increments: Vec<(String, Expr)>,
    ) -> Result<Option<(ColumnDeltas, Vec<Expr>, ParamChecks)>, Refusal> {
        if !u.order_by.is_empty() {
            return Err(Refusal::shape(
                "ORDER BY in a counter increment cannot be rewritten",
            ));
        }
        let increments = combine_increments(increments);
        let mut param_checks = Vec::new();
        for (col, delta) in &increments {
            check_delta(col, delta, ctx, &mut param_checks)?;
        }
        let keys = self.key_values(u.selection.as_ref())?;
        let limit_zero = match &u.limit {
            None => false,
            Some(l) => match ctx.literal_class(l) {
                Some(LiteralClass::Integer { digits: 0 }) => true,
                Some(LiteralClass::Integer { .. }) => false,
                _ => {
                    return Err(Refusal::shape(format!(
                        "LIMIT {l} in a counter increment cannot be rewritten; use LIMIT 1 or none"
                    )))
                }
            },
        };
        let meta = self.logical.columns(ctx)?;
        if self.check_keys(&keys, &meta, ctx, &mut param_checks)? == Keys::MatchNothing
            || limit_zero
        {
            return Ok(None);
        }
        Ok(Some((increments, keys, param_checks)))
    }

    /// Whether the slot upsert stores each key value as the very value the UPDATE's
    /// `key = value` compares with. MariaDB compares a number with a string column
    /// numerically (`slug = 0` matches every non-numeric slug), truncates or
    /// refuses values that do not fit, and matches nothing for `= NULL`; the slot
    /// row would instead get a converted value. Only a string literal that surely
    /// fits a string key and an integer literal in range of an integer key are
    /// exact; parameters are taken as they come.
    fn check_keys(
        &self,
        keys: &[Expr],
        meta: &[ColumnDef],
        ctx: &PlanContext<'_>,
        param_checks: &mut Vec<(usize, ParamCheck)>,
    ) -> Result<Keys, Refusal> {
        let mut out = Keys::Exact;
        for (k, v) in self.logical.key().iter().zip(keys) {
            let def = meta
                .iter()
                .find(|d| eq(&String::from_utf8_lossy(&d.org_name), k))
                .ok_or_else(|| {
                    Refusal::schema(format!("table {} has no column `{k}`", self.logical.name()))
                })?;
            let mut e = v;
            let mut negative = false;
            loop {
                match e {
                    Expr::Nested(inner) => e = inner,
                    Expr::UnaryOp {
                        op: op @ (UnaryOperator::Minus | UnaryOperator::Plus),
                        expr,
                    } => {
                        negative ^= *op == UnaryOperator::Minus;
                        e = expr;
                    }
                    _ => break,
                }
            }
            if matches!(e, Expr::Value(v) if v.value == sqlparser::ast::Value::Null) {
                out = Keys::MatchNothing;
                continue;
            }
            if let Some(Slot::Param(j)) = ctx.slot(e) {
                // Checked at each execute: the value must be what a literal must be.
                let check = match key_type(def) {
                    KeyType::String { max_chars } => ParamCheck::String {
                        max_bytes: max_chars,
                    },
                    // `key = -?`: the parameter is the key's negation.
                    KeyType::Integer { unsigned, max } if negative => ParamCheck::Integer {
                        min: -(max as i128),
                        max: if unsigned { 0 } else { max as i128 + 1 },
                    },
                    KeyType::Integer { unsigned, max } => ParamCheck::Integer {
                        min: if unsigned { 0 } else { -(max as i128) - 1 },
                        max: max as i128,
                    },
                    KeyType::Other => {
                        return Err(Refusal::schema(format!(
                            "key column `{k}` has a type for which increments are not rewritten (only integer and string keys are)"
                        )))
                    }
                };
                param_checks.push((j, check));
                continue;
            }
            let class = ctx.literal_class(e);
            let refuse = |why: &str| {
                Err(Refusal::value(format!(
                    "the key value for column `{k}` {why}; an increment is rewritten only for a key value the slot row stores exactly"
                )))
            };
            match key_type(def) {
                KeyType::String { max_chars } => match class {
                    Some(LiteralClass::String { bytes }) if !negative => {
                        if usize::from(bytes).saturating_sub(2) > max_chars {
                            return refuse(&format!("may be longer than the column's {max_chars} characters"));
                        }
                    }
                    _ => return refuse("is not a string literal (MariaDB would compare the string column numerically or by another type)"),
                },
                KeyType::Integer { unsigned, max } => match class {
                    Some(LiteralClass::Integer { digits }) => {
                        let fits = if digits == 0 {
                            true
                        } else if negative && unsigned {
                            false
                        } else if u32::from(digits) <= max.ilog10() {
                            true
                        } else {
                            // As many digits as the bound: the value decides (and the
                            // plan is then cached per value).
                            ctx.literal(e)
                                .and_then(|l| std::str::from_utf8(&l.text).ok()?.parse::<u128>().ok())
                                .is_some_and(|n| n <= max || (negative && n == max + 1))
                        };
                        if !fits {
                            return refuse("is out of the column's range");
                        }
                    }
                    _ => return refuse("is not an integer literal"),
                },
                KeyType::Other => {
                    return Err(Refusal::schema(format!(
                        "key column `{k}` has a type for which increments are not rewritten (only integer and string keys are)"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// `DELETE FROM slots [WHERE …]` for a WHERE that may only name key columns.
    fn clear_slots_sql(
        &self,
        logical: &ObjectName,
        selection: Option<&Expr>,
    ) -> Result<String, Refusal> {
        let mut sql = format!("DELETE FROM {}", self.slot_sql(logical));
        if let Some(w) = selection {
            let w = requalify(w, |c| self.logical.is_key(c)).map_err(|r| {
                r.map_reason(|what| {
                    format!(
                        "the WHERE condition uses {what}; only the key columns ({}) can select counters to set or delete",
                        self.logical.key().join(", ")
                    )
                })
            })?;
            sql.push_str(&format!(" WHERE {w}"));
        }
        Ok(sql)
    }

    /// The values of every key column in a `k1 = v1 AND k2 = v2` condition, in key
    /// order; an error for any other shape.
    fn key_values(&self, selection: Option<&Expr>) -> Result<Vec<Expr>, Refusal> {
        key_equalities(self.logical.key(), selection).ok_or_else(|| {
            Refusal::shape(if self.logical.key().is_empty() {
                "this counter has no key columns: increment it without WHERE".to_string()
            } else {
                format!(
                    "an increment must select one counter with `{}`",
                    self.logical
                        .key()
                        .iter()
                        .map(|k| format!("{k} = value"))
                        .collect::<Vec<_>>()
                        .join(" AND ")
                )
            })
        })
    }

    fn upsert_sql(
        &self,
        logical: &ObjectName,
        keys: &[Expr],
        slot: &str,
        incs: &[(String, Expr)],
    ) -> String {
        let mut cols: Vec<String> = self.logical.key().iter().map(|k| quote(k)).collect();
        cols.push(quote(&self.slot_column));
        let mut vals: Vec<String> = keys.iter().map(ToString::to_string).collect();
        vals.push(slot.to_string());
        let mut upd = Vec::new();
        for (c, d) in incs {
            cols.push(quote(c));
            vals.push(d.to_string());
            upd.push(format!("{0} = {0} + VALUES({0})", quote(c)));
        }
        format!(
            "INSERT INTO {} ({}) VALUES ({}) ON DUPLICATE KEY UPDATE {}",
            self.slot_sql(logical),
            cols.join(", "),
            vals.join(", "),
            upd.join(", ")
        )
    }

    /// The [`IncrementPieces`] a merged write rebuilds the upsert from.
    fn merge_pieces(
        &self,
        logical: &ObjectName,
        keys: &[Expr],
        slot: &str,
        incs: &[(String, Expr)],
    ) -> Vec<String> {
        let mut cols: Vec<String> = self.logical.key().iter().map(|k| quote(k)).collect();
        cols.push(quote(&self.slot_column));
        cols.extend(incs.iter().map(|(c, _)| quote(c)));
        let upd: Vec<String> = incs
            .iter()
            .map(|(c, _)| format!("{0} = {0} + VALUES({0})", quote(c)))
            .collect();
        let deltas: Vec<String> = incs.iter().map(|(_, d)| d.to_string()).collect();
        IncrementPieces {
            prefix: &format!(
                "INSERT INTO {} ({}) VALUES (",
                self.slot_sql(logical),
                cols.join(", ")
            ),
            keys: &keys
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            suffix: &format!(") ON DUPLICATE KEY UPDATE {}", upd.join(", ")),
            slot: &slot.to_string(),
            deltas: &deltas,
        }
        .to_aux()
    }

    fn plan_insert(
        &self,
        ins: &Insert,
        stmt: &Statement,
        ctx: &PlanContext<'_>,
    ) -> Result<Option<Plan>, Refusal> {
        let TableObject::TableName(name) = &ins.table else {
            return self.plan_read(stmt, ctx);
        };
        if !self.logical.named_by(name, ctx) {
            return self.plan_read(stmt, ctx);
        }
        if ins.replace_into {
            return Err(Refusal::shape("REPLACE into a counter table cannot be rewritten; use INSERT … ON DUPLICATE KEY UPDATE"));
        }
        let Some(OnInsert::DuplicateKeyUpdate(assignments)) = &ins.on else {
            // A plain insert writes the base value of a new counter: correct as is,
            // unless it reads the counter table itself.
            if let Some(src) = &ins.source {
                if self.query_reads_ours(src, ctx) {
                    return Err(Refusal::shape(
                        "INSERT … SELECT from the counter table into itself cannot be rewritten",
                    ));
                }
            }
            return Ok(None);
        };
        unsupported_clauses(stmt)?;
        if ins.ignore {
            return Err(Refusal::shape(
                "INSERT IGNORE … ON DUPLICATE KEY UPDATE into a counter table cannot be rewritten",
            ));
        }
        let rows = match ins.source.as_deref().map(|q| q.body.as_ref()) {
            Some(SetExpr::Values(v)) => &v.rows,
            _ => {
                return Err(Refusal::shape(
                    "INSERT … ON DUPLICATE KEY UPDATE into a counter table needs a VALUES list",
                ))
            }
        };
        if rows.len() != 1 {
            return Err(Refusal::shape("INSERT … ON DUPLICATE KEY UPDATE of several counters at once cannot be rewritten; insert one row per statement"));
        }
        let row = &rows[0].content;
        let cols: Vec<String> = ins.columns.iter().map(last_ident).collect();
        if cols.len() != row.len() {
            return Err(Refusal::shape(
                "the column list and the VALUES list differ in length",
            ));
        }
        let value_of = |c: &str| cols.iter().position(|x| eq(x, c)).map(|i| &row[i]);
        let mut keys = Vec::with_capacity(self.logical.key().len());
        for k in self.logical.key() {
            let v = value_of(k).ok_or_else(|| {
                Refusal::shape(format!("the INSERT must give the key column `{k}`"))
            })?;
            if !is_value(v) {
                return Err(Refusal::value(format!(
                    "the key column `{k}` must be given a value"
                )));
            }
            keys.push(v.clone());
        }
        let (incs, param_checks) = self.insert_increments(assignments, &cols, row, ctx)?;
        if self.drain {
            // The base takes the insert or the increment; reads still add the slots.
            return Ok(None);
        }
        // The base row: the original insert with counters at zero, ignoring a
        // duplicate key (then the row exists and only the slot grows).
        // Then, only when that was skipped, the key alone: both skipped by the same
        // duplicate-key warning say the duplicate is the key's (the relay checks).
        // An insert of the key and the counters alone is that statement already.
        let base = self.base_insert_sql(name, &cols, row);
        let slot = ctx.random_below(self.slots).to_string();
        let mut statements = parse(&base)?;
        let key_only = cols.len() == self.logical.key().len() + self.columns.len()
            && cols
                .iter()
                .all(|c| self.logical.is_key(c) || self.is_counter(c));
        let key_probe = match key_only {
            true => None,
            false => {
                statements.extend(parse(&self.key_insert_sql(name, &keys))?);
                Some(1)
            }
        };
        statements.extend(parse(&self.upsert_sql(name, &keys, &slot, &incs))?);
        Ok(Some(Plan {
            statements,
            reply: Reply::Ok {
                affected_rows: Affected::InsertedOrUpdated {
                    probe: 0,
                    key_probe,
                },
                info: None,
                last_insert_id: None,
            },
            atomic: true,
            param_checks,
            ..Default::default()
        }))
    }

    /// The counter increments of an `INSERT … ON DUPLICATE KEY UPDATE c = c + n`
    /// (whose inserted counter values must equal their increments), and the
    /// execute-time checks of their parameters.
    fn insert_increments(
        &self,
        assignments: &[Assignment],
        cols: &[String],
        row: &[Expr],
        ctx: &PlanContext<'_>,
    ) -> Result<(ColumnDeltas, ParamChecks), Refusal> {
        let value_of = |c: &str| cols.iter().position(|x| eq(x, c)).map(|i| &row[i]);
        let mut incs = Vec::new();
        let mut param_checks = Vec::new();
        for a in assignments {
            let AssignmentTarget::ColumnName(col) = &a.target else {
                return Err(Refusal::shape("tuple assignments cannot be rewritten"));
            };
            let col = last_ident(col);
            if !self.is_counter(&col) {
                return Err(Refusal::shape(format!(
                    "ON DUPLICATE KEY UPDATE may only increment counter columns, not `{col}`"
                )));
            }
            let delta = match increment_of(&col, &a.value) {
                Some(Expr::Function(f)) if f.name.to_string().eq_ignore_ascii_case("VALUES") => {
                    value_of(&col).cloned().ok_or_else(|| Refusal::shape(format!("VALUES({col}) needs `{col}` in the column list")))?
                }
                Some(d) => d,
                None => {
                    return Err(Refusal::shape(format!(
                        "ON DUPLICATE KEY UPDATE {col} = {} cannot be rewritten: only `{col} = {col} + n` is supported",
                        a.value
                    )))
                }
            };
            // A new counter starts at the inserted value, an existing one grows by
            // the increment: one slot delta serves both only if they are equal.
            let inserted = value_of(&col).ok_or_else(|| {
                Refusal::shape(format!("the INSERT must give the counter column `{col}`"))
            })?;
            if !same_value(inserted, &delta, ctx) {
                return Err(Refusal::shape(format!(
                    "the inserted value of `{col}` and its increment differ; only `INSERT … VALUES (…, n) ON DUPLICATE KEY UPDATE {col} = {col} + n` can be rewritten"
                )));
            }
            check_delta(&col, &delta, ctx, &mut param_checks)?;
            incs.push((col, delta));
        }
        Ok((incs, param_checks))
    }

    /// `INSERT IGNORE INTO t (…) VALUES (…)`: the insert's row with its counter
    /// columns at zero.
    fn base_insert_sql(&self, name: &ObjectName, cols: &[String], row: &[Expr]) -> String {
        let base_vals: Vec<String> = cols
            .iter()
            .zip(row)
            .map(|(c, v)| {
                if self.is_counter(c) {
                    "0".to_string()
                } else {
                    v.to_string()
                }
            })
            .collect();
        format!(
            "INSERT IGNORE INTO {name} ({}) VALUES ({})",
            cols.iter().map(|c| quote(c)).collect::<Vec<_>>().join(", "),
            base_vals.join(", ")
        )
    }

    /// `INSERT IGNORE INTO t (key…, counters…) VALUES (…, 0…)`: the row the slot
    /// table's trigger creates for a new key.
    fn key_insert_sql(&self, name: &ObjectName, keys: &[Expr]) -> String {
        let values: Vec<String> = keys.iter().map(ToString::to_string).collect();
        super::schema::key_row_insert(
            "INSERT IGNORE",
            &name.to_string(),
            self.logical.key(),
            &self.columns,
            &values,
        )
    }

    fn query_reads_ours(&self, q: &Query, ctx: &PlanContext<'_>) -> bool {
        let mut found = false;
        let _ = sqlparser::ast::visit_relations(q, |r| {
            if self.logical.named_by(r, ctx) {
                found = true;
            }
            ControlFlow::<()>::Continue(())
        });
        found
    }

    fn plan_delete(
        &self,
        d: &Delete,
        stmt: &Statement,
        ctx: &PlanContext<'_>,
    ) -> Result<Option<Plan>, Refusal> {
        let from = match &d.from {
            FromTable::WithFromKeyword(f) | FromTable::WithoutKeyword(f) => f,
        };
        let ours_in_from = from.iter().any(|t| {
            self.logical.is_factor(&t.relation, ctx)
                || t.joins
                    .iter()
                    .any(|j| self.logical.is_factor(&j.relation, ctx))
        });
        let multi = !d.tables.is_empty()
            || d.using.is_some()
            || from.len() != 1
            || from.iter().any(|t| !t.joins.is_empty());
        if !ours_in_from {
            return self.plan_read(stmt, ctx);
        }
        unsupported_clauses(stmt)?;
        if multi {
            return Err(Refusal::shape(format!(
                "a multi-table DELETE involving counter table {} cannot be rewritten",
                self.logical.name()
            )));
        }
        let TableFactor::Table { name, .. } = &from[0].relation else {
            return Err(Refusal::shape("unexpected DELETE target"));
        };
        if let Some((q, alias)) = target_qualifier(&from[0].relation) {
            check_qualifiers(d.selection.iter(), &q, alias)?;
        }
        if d.limit.is_some() || !d.order_by.is_empty() {
            return Err(Refusal::shape(
                "DELETE with ORDER BY or LIMIT from a counter table cannot be rewritten",
            ));
        }
        if let Some(w) = &d.selection {
            if self.mentions_counter(w) {
                return Err(Refusal::shape("a WHERE condition on a counter column cannot be rewritten (the stored value is only the base)"));
            }
        }
        self.clear_slots_then(name, d.selection.as_ref(), stmt)
    }

    fn mentions_counter(&self, e: &Expr) -> bool {
        mentions_column(e, |c| self.is_counter(c))
    }
}

impl Rule for CounterRule {
    fn merges(&self) -> bool {
        self.coalesce
    }

    fn physical_tables(&self) -> Vec<(String, String)> {
        vec![(
            self.slot_table.name.clone(),
            self.logical.name().name.to_string(),
        )]
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

    fn provide_metadata(&self, current_db: Option<&str>, columns: &[ColumnDef]) {
        self.logical.provide_metadata(current_db, columns);
    }

    fn plan(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, Refusal> {
        let meta = self.logical.columns(ctx)?;
        for c in self.logical.key().iter().chain(&self.columns) {
            if !meta
                .iter()
                .any(|d| eq(&String::from_utf8_lossy(&d.org_name), c))
            {
                return Err(Refusal::schema(format!(
                    "table {} has no column `{c}`",
                    self.logical.name()
                )));
            }
        }
        for d in meta
            .iter()
            .filter(|d| self.is_counter(&String::from_utf8_lossy(&d.org_name)))
        {
            if !matches!(
                d.column_type,
                types::TINY | types::SHORT | types::INT24 | types::LONG | types::LONGLONG
            ) {
                return Err(Refusal::schema(format!(
                    "counter column `{}` must be an integer column",
                    String::from_utf8_lossy(&d.org_name)
                )));
            }
        }
        match stmt {
            Statement::Update(u) => self.plan_update(u, stmt, ctx),
            Statement::Insert(i) => self.plan_insert(i, stmt, ctx),
            Statement::Delete(d) => self.plan_delete(d, stmt, ctx),
            Statement::Query(_) => self.plan_read(stmt, ctx),
            _ if is_table_ddl(stmt) => Err(ddl_rejection(
                stmt,
                "counter",
                self.logical.name(),
                "slot table",
            )),
            _ => self.plan_read(stmt, ctx),
        }
    }
}

/// The delta of `col = col + n`, `col = n + col` or `col = col - n` (also
/// `col + VALUES(col)`), or `None`.
/// What an increment's key values select.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// One row, by values the slot row stores exactly.
    Exact,
    /// No row (`key = NULL`).
    MatchNothing,
}

/// A key column's type, as far as the increment checks need it.
enum KeyType {
    /// CHAR, VARCHAR, BINARY, VARBINARY, TEXT, BLOB: holds at least `max_chars`.
    String { max_chars: usize },
    /// An integer type: values up to `max` (the negative bound is `-(max + 1)`).
    Integer { unsigned: bool, max: u128 },
    /// Anything else.
    Other,
}

fn key_type(def: &ColumnDef) -> KeyType {
    let unsigned = def.flags & UNSIGNED_FLAG != 0;
    let bits = match def.column_type {
        types::TINY => 8,
        types::SHORT => 16,
        types::INT24 => 24,
        types::LONG => 32,
        types::LONGLONG => 64,
        0x0f | 0xfd | 0xfe | 0xf9 | 0xfa | 0xfb | 0xfc => {
            // The definition's length is in bytes: characters × the charset's
            // longest character (1 for binary and latin1, at most 4 otherwise).
            let mbmax = match def.charset {
                63 | 8 | 5 | 15 | 31 | 47 | 48 | 49 | 94 => 1,
                _ => 4,
            };
            return KeyType::String {
                max_chars: def.length as usize / mbmax,
            };
        }
        _ => return KeyType::Other,
    };
    let max = if unsigned {
        (1u128 << bits) - 1
    } else {
        (1u128 << (bits - 1)) - 1
    };
    KeyType::Integer { unsigned, max }
}

/// `SET c = c + 1, c = c + 2` adds both (MariaDB applies assignments left to right):
/// one delta per column, the sum of its increments.
fn combine_increments(increments: Vec<(String, Expr)>) -> Vec<(String, Expr)> {
    let mut out: Vec<(String, Expr)> = Vec::with_capacity(increments.len());
    for (col, delta) in increments {
        match out.iter_mut().find(|(c, _)| eq(c, &col)) {
            Some((_, sum)) => {
                *sum = Expr::BinaryOp {
                    left: Box::new(Expr::Nested(Box::new(sum.clone()))),
                    op: BinaryOperator::Plus,
                    right: Box::new(Expr::Nested(Box::new(delta))),
                }
            }
            None => out.push((col, delta)),
        }
    }
    out
}

/// Digits of the largest delta literal: any sum of a few such deltas fits a BIGINT
/// slot.
const MAX_DELTA_DIGITS: u8 = 18;
/// The largest delta parameter value.
const MAX_DELTA: i128 = 999_999_999_999_999_999;

/// An increment's delta is an integer literal or a parameter: anything else
/// (`NULL`, which sets the counter to NULL or 0; `1.5` or `'1'`, which MariaDB
/// rounds or converts against the whole value, not the delta) is refused.
fn check_delta(
    col: &str,
    delta: &Expr,
    ctx: &PlanContext<'_>,
    param_checks: &mut Vec<(usize, ParamCheck)>,
) -> Result<(), Refusal> {
    // Sums of combined increments, signs and parentheses around each term.
    let mut stack = vec![delta];
    while let Some(e) = stack.pop() {
        match e {
            Expr::Nested(inner) => stack.push(inner),
            Expr::UnaryOp {
                op: UnaryOperator::Minus | UnaryOperator::Plus,
                expr,
            } => stack.push(expr),
            Expr::BinaryOp {
                left,
                op: BinaryOperator::Plus,
                right,
            } => {
                stack.push(left);
                stack.push(right);
            }
            _ => match (ctx.slot(e), ctx.literal_class(e)) {
                (Some(Slot::Param(j)), _) => param_checks.push((
                    j,
                    ParamCheck::Integer {
                        min: -MAX_DELTA,
                        max: MAX_DELTA,
                    },
                )),
                (_, Some(LiteralClass::Integer { digits })) if digits <= MAX_DELTA_DIGITS => {}
                _ => {
                    return Err(Refusal::value(format!(
                        "SET {col} = {col} + {e} cannot be rewritten exactly: a counter is incremented by integer literals or parameters"
                    )))
                }
            },
        }
    }
    Ok(())
}

fn increment_of(col: &str, e: &Expr) -> Option<Expr> {
    let Expr::BinaryOp { left, op, right } = e else {
        return if let Expr::Nested(inner) = e {
            increment_of(col, inner)
        } else {
            None
        };
    };
    let is_col = |x: &Expr| column_name(x).is_some_and(|c| eq(&c, col));
    let is_values_fn = |x: &Expr| matches!(x, Expr::Function(f) if f.name.to_string().eq_ignore_ascii_case("VALUES"));
    match op {
        BinaryOperator::Plus if is_col(left) && (is_value(right) || is_values_fn(right)) => {
            Some((**right).clone())
        }
        BinaryOperator::Plus if is_col(right) && is_value(left) => Some((**left).clone()),
        BinaryOperator::Minus if is_col(left) && is_value(right) => Some(Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr: Box::new(Expr::Nested(right.clone())),
        }),
        _ => None,
    }
}

/// Whether two value expressions are the same value: the same marker, or literals
/// with the same text.
fn same_value(a: &Expr, b: &Expr, ctx: &PlanContext<'_>) -> bool {
    if a == b {
        return true;
    }
    match (ctx.literal(a), ctx.literal(b)) {
        (Some(x), Some(y)) => x.text == y.text,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rewrite::testutil::{assert_sql, decide, reject, rewrite};
    use crate::rewrite::{Decision, Engine, StatementContext};

    fn col(name: &str, t: u8, flags: u16) -> ColumnDef {
        crate::rewrite::testutil::col("hits", name, t, flags)
    }

    /// An engine with one counter rule on `hits(slug, cnt, note)`; one slot so the
    /// rendered slot number is always 0.
    fn engine(key: &[&str]) -> Engine {
        engine_with(
            &format!("name = \"page_hits\"\ntable = \"hits\"\nkey = {key:?}\nslot_table = \"hits_slots\"\n"),
            &[
                col("slug", 0xfd, 0x5003),
                col("cnt", types::LONG, 1),
                col("note", 0xfd, 0),
            ],
        )
    }

    /// An engine with one counter rule on `cnt` (one slot) whose other keys are
    /// `section`, and the logical table's `columns` known for database `shop`.
    fn engine_with(section: &str, columns: &[ColumnDef]) -> Engine {
        let spec: Vec<CounterSpec> = crate::kinds::entries(
            &format!("[[counter]]\ncolumns = [\"cnt\"]\nslots = 1\n{section}"),
            "counter",
        )
        .unwrap();
        let rule = CounterRule::new(&spec[0]).unwrap();
        let e = Engine::new(vec![Arc::new(rule)], 1000).unwrap();
        e.provide_metadata(0, Some("shop"), columns);
        e
    }

    #[test]
    fn refusals_name_their_class() {
        use crate::rewrite::testutil::refusal;
        use crate::rewrite::RefusalClass;
        let e = engine(&["slug"]);
        for (sql, class) in [
            (
                "REPLACE INTO hits (slug, cnt) VALUES ('a', 1)",
                RefusalClass::Shape,
            ),
            ("ALTER TABLE hits ADD COLUMN x INT", RefusalClass::Ddl),
            ("TRUNCATE TABLE hits", RefusalClass::Ddl),
            // A number where the string key is compared: MariaDB would compare
            // numerically.
            (
                "UPDATE hits SET cnt = cnt + 1 WHERE slug = 5",
                RefusalClass::Value,
            ),
            (
                "UPDATE hits SET cnt = cnt + 1.5 WHERE slug = 'a'",
                RefusalClass::Value,
            ),
        ] {
            let (got, why) = refusal(&e, sql);
            assert_eq!(got, class, "{sql}: {why}");
        }
    }

    const DERIVED: &str = "(SELECT `hs_h`.`slug`, CAST(`hs_h`.`cnt` + COALESCE((SELECT SUM(`hs_s`.`cnt`) FROM `hits_slots` AS `hs_s` WHERE `hs_s`.`slug` = `hs_h`.`slug`), 0) AS SIGNED) AS `cnt`, `hs_h`.`note` FROM hits AS `hs_h`)";

    #[test]
    fn metadata_is_asked_first() {
        let spec: Vec<CounterSpec> = crate::kinds::entries(
            "[[counter]]\nname = \"x\"\ntable = \"shop.hits\"\ncolumns = [\"cnt\"]\nslots = 4\nslot_table = \"s\"\n",
            "counter",
        )
        .unwrap();
        let e = Engine::new(vec![Arc::new(CounterRule::new(&spec[0]).unwrap())], 10).unwrap();
        match decide(&e, "SELECT cnt FROM hits") {
            Decision::NeedMetadata(m) => {
                assert_eq!(m.sql, "SELECT * FROM `shop`.`hits` LIMIT 0")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn qualified_tables_use_their_own_database_columns() {
        // Columns known for `shop` only (see `engine`).
        let e = engine(&["slug"]);
        let ctx = |db| StatementContext {
            prepared: false,
            in_transaction: false,
            current_db: db,
            ..Default::default()
        };
        let sql = b"UPDATE app.hits SET cnt = cnt + 1 WHERE slug = 'home'";
        // Whatever the default database, `app`'s columns are asked for.
        for db in [None, Some("shop"), Some("other")] {
            match e.decide(sql, &ctx(db)) {
                Decision::NeedMetadata(m) => {
                    assert_eq!(m.sql, "SELECT * FROM `app`.`hits` LIMIT 0");
                    assert_eq!(m.db.as_deref(), Some("app"));
                }
                other => panic!("{db:?}: {other:?}"),
            }
        }
        e.provide_metadata(
            0,
            Some("app"),
            &[col("slug", 0xfd, 0x5003), col("cnt", types::LONG, 1)],
        );
        let want = "INSERT INTO app.`hits_slots` (`slug`, `slot`, `cnt`) VALUES ('home', 0, 1) ON DUPLICATE KEY UPDATE `cnt` = `cnt` + VALUES(`cnt`)";
        for db in [None, Some("other")] {
            match e.decide(sql, &ctx(db)) {
                Decision::Rewrite(r) => assert_sql(&r, &[want]),
                other => panic!("{db:?}: {other:?}"),
            }
        }
        // An unqualified name still means the default database's table.
        match e.decide(
            b"UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a'",
            &ctx(Some("app2")),
        ) {
            Decision::NeedMetadata(m) => assert_eq!(m.db.as_deref(), Some("app2")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn increments_become_slot_upserts() {
        let e = engine(&["slug"]);
        let want = "INSERT INTO `hits_slots` (`slug`, `slot`, `cnt`) VALUES ('home', 0, 1) ON DUPLICATE KEY UPDATE `cnt` = `cnt` + VALUES(`cnt`)";
        for sql in [
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'",
            "update `hits` set `cnt` = 1 + `cnt` where `slug` = 'home' limit 1",
            "UPDATE shop.hits SET hits.cnt = hits.cnt + 1 WHERE 'home' = slug",
        ] {
            let r = rewrite(&e, sql);
            let want = if sql.contains("shop.hits") {
                want.replace("`hits_slots`", "shop.`hits_slots`")
            } else {
                want.to_string()
            };
            assert_sql(&r, &[&want]);
            assert_eq!(
                r.reply,
                Reply::Ok {
                    affected_rows: Affected::Fixed(1),
                    info: Some("Rows matched: 1  Changed: 1  Warnings: 0".into()),
                    last_insert_id: None,
                }
            );
            assert!(!r.atomic);
        }
        let r = rewrite(&e, "UPDATE hits SET cnt = cnt - 5 WHERE slug = 'a''b'");
        assert_sql(
            &r,
            &["INSERT INTO `hits_slots` (`slug`, `slot`, `cnt`) VALUES ('a''b', 0, -(5)) ON DUPLICATE KEY UPDATE `cnt` = `cnt` + VALUES(`cnt`)"],
        );
    }

    #[test]
    fn literals_are_copied_verbatim_from_each_statement() {
        let e = engine(&["slug"]);
        let a = rewrite(&e, "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'it\\'s'");
        let b = rewrite(&e, "UPDATE hits SET cnt = cnt + 7 WHERE slug = 'x'");
        assert!(String::from_utf8_lossy(&a.statements[0]).contains("'it\\'s'"));
        assert!(String::from_utf8_lossy(&b.statements[0]).contains("VALUES ('x', 0, 7)"));
    }

    #[test]
    fn global_counter_without_key() {
        let e = engine(&[]);
        let r = rewrite(&e, "UPDATE hits SET cnt = cnt + 1");
        assert_sql(&r, &["INSERT INTO `hits_slots` (`slot`, `cnt`) VALUES (0, 1) ON DUPLICATE KEY UPDATE `cnt` = `cnt` + VALUES(`cnt`)"]);
        assert!(
            reject(&e, "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'x'").contains("without WHERE")
        );
    }

    #[test]
    fn absolute_set_and_delete_clear_slots_atomically() {
        let e = engine(&["slug"]);
        let r = rewrite(
            &e,
            "UPDATE hits SET cnt = 0, note = 'reset' WHERE hits.slug = 'home'",
        );
        assert_sql(
            &r,
            &[
                "DELETE FROM `hits_slots` WHERE slug = 'home'",
                "UPDATE hits SET cnt = 0, note = 'reset' WHERE hits.slug = 'home'",
            ],
        );
        assert!(r.atomic);
        assert_eq!(r.reply, Reply::OkOf(1));
        let r = rewrite(&e, "DELETE FROM hits WHERE slug IN ('a', 'b')");
        assert_sql(
            &r,
            &[
                "DELETE FROM `hits_slots` WHERE slug IN ('a', 'b')",
                "DELETE FROM hits WHERE slug IN ('a', 'b')",
            ],
        );
        let r = rewrite(&e, "DELETE FROM hits");
        assert_sql(&r, &["DELETE FROM `hits_slots`", "DELETE FROM hits"]);
    }

    #[test]
    fn insert_on_duplicate_key_update() {
        let e = engine(&["slug"]);
        let r = rewrite(&e, "INSERT INTO hits (slug, cnt, note) VALUES ('home', 1, 'n') ON DUPLICATE KEY UPDATE cnt = cnt + 1");
        assert_sql(
            &r,
            &[
                "INSERT IGNORE INTO hits (`slug`, `cnt`, `note`) VALUES ('home', 0, 'n')",
                "INSERT IGNORE INTO hits (`slug`, `cnt`) VALUES ('home', 0)",
                "INSERT INTO `hits_slots` (`slug`, `slot`, `cnt`) VALUES ('home', 0, 1) ON DUPLICATE KEY UPDATE `cnt` = `cnt` + VALUES(`cnt`)",
            ],
        );
        assert!(r.atomic);
        assert_eq!(
            r.reply,
            Reply::Ok {
                affected_rows: Affected::InsertedOrUpdated {
                    probe: 0,
                    key_probe: Some(1)
                },
                info: None,
                last_insert_id: None,
            }
        );
        let r = rewrite(&e, "INSERT INTO hits (slug, cnt) VALUES ('home', 3) ON DUPLICATE KEY UPDATE cnt = cnt + VALUES(cnt)");
        // The key and the counter alone: the row probe is the key probe already.
        assert_sql(
            &r,
            &[
                "INSERT IGNORE INTO hits (`slug`, `cnt`) VALUES ('home', 0)",
                "INSERT INTO `hits_slots` (`slug`, `slot`, `cnt`) VALUES ('home', 0, 3) ON DUPLICATE KEY UPDATE `cnt` = `cnt` + VALUES(`cnt`)",
            ],
        );
        assert!(matches!(
            r.reply,
            Reply::Ok {
                affected_rows: Affected::InsertedOrUpdated {
                    probe: 0,
                    key_probe: None
                },
                ..
            }
        ));
        assert!(reject(
            &e,
            "INSERT INTO hits (slug, cnt) VALUES ('home', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 2"
        )
        .contains("differ"));
        assert!(matches!(
            decide(&e, "INSERT INTO hits (slug, cnt) VALUES ('new', 5)"),
            Decision::Passthrough
        ));
    }

    #[test]
    fn reads_see_base_plus_slots() {
        let e = engine(&["slug"]);
        let r = rewrite(&e, "SELECT cnt FROM hits WHERE slug = 'home'");
        assert_sql(
            &r,
            &[&format!(
                "SELECT cnt FROM {DERIVED} AS hits WHERE slug = 'home'"
            )],
        );
        let Reply::Patched(p) = &r.reply else {
            panic!("{:?}", r.reply)
        };
        assert_eq!(p.tables, vec!["hits".to_string()]);
        assert_eq!(p.columns.len(), 3);
        let r = rewrite(
            &e,
            "SELECT h.cnt, o.x FROM hits h JOIN other o ON o.slug = h.slug ORDER BY h.cnt DESC",
        );
        assert_sql(&r, &[&format!("SELECT h.cnt, o.x FROM {DERIVED} AS h JOIN other o ON o.slug = h.slug ORDER BY h.cnt DESC")]);
        let r = rewrite(&e, "EXPLAIN SELECT * FROM hits WHERE slug = 'home'");
        assert_sql(
            &r,
            &[&format!(
                "EXPLAIN SELECT * FROM {DERIVED} AS hits WHERE slug = 'home'"
            )],
        );
        // Updating other columns, or reading nothing of the table, passes through.
        assert!(matches!(
            decide(&e, "UPDATE hits SET note = 'x' WHERE slug = 'home'"),
            Decision::Passthrough
        ));
        assert!(matches!(
            decide(&e, "SHOW CREATE TABLE hits"),
            Decision::Passthrough
        ));
    }

    #[test]
    fn unfaithful_shapes_are_rejected() {
        let e = engine(&["slug"]);
        for (sql, why) in [
            (
                "UPDATE hits SET cnt = cnt * 2 WHERE slug = 'home'",
                "cannot be rewritten",
            ),
            (
                "UPDATE hits SET cnt = cnt + 1 WHERE cnt > 5",
                "WHERE condition on a counter",
            ),
            (
                "UPDATE hits SET cnt = cnt + 1 WHERE slug > 'a'",
                "must select one counter",
            ),
            (
                "UPDATE hits SET cnt = cnt + 1, note = 'x' WHERE slug = 'a'",
                "may not also set",
            ),
            (
                "UPDATE hits h JOIN other o ON o.slug = h.slug SET h.cnt = h.cnt + 1",
                "multi-table UPDATE",
            ),
            (
                "UPDATE hits SET note = 'x' WHERE cnt = 3",
                "WHERE condition on a counter",
            ),
            (
                "DELETE FROM hits WHERE cnt = 0",
                "WHERE condition on a counter",
            ),
            ("DELETE FROM hits WHERE note = 'x'", "only the key columns"),
            ("TRUNCATE TABLE hits", "TRUNCATE"),
            ("ALTER TABLE hits ADD COLUMN x INT", "ALTER"),
            ("REPLACE INTO hits (slug, cnt) VALUES ('a', 1)", "REPLACE"),
        ] {
            let msg = reject(&e, sql);
            assert!(
                msg.starts_with("heatsink rule 'page_hits': "),
                "{sql}: {msg}"
            );
            assert!(msg.contains(why), "{sql}: {msg}");
            assert!(!msg.contains("?1"), "{sql}: markers leak into {msg}");
        }
    }

    #[test]
    fn prepared_statements_map_parameters() {
        let e = engine(&["slug"]);
        let d = crate::rewrite::testutil::decide_prepared(
            &e,
            "UPDATE hits SET cnt = cnt + ? WHERE slug = ?",
        );
        let Decision::Rewrite(r) = d else {
            panic!("{d:?}")
        };
        assert_eq!(r.param_map, Some(vec![1, 0]));
        // Each execute's values are checked against what a literal must be.
        assert_eq!(
            r.param_checks,
            vec![
                (
                    0,
                    ParamCheck::Integer {
                        min: -MAX_DELTA,
                        max: MAX_DELTA
                    }
                ),
                (1, ParamCheck::String { max_bytes: 64 }),
            ]
        );
        // Text statements carry none.
        assert!(
            rewrite(&e, "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a'")
                .param_checks
                .is_empty()
        );
        assert_sql(
            &r,
            &["INSERT INTO `hits_slots` (`slug`, `slot`, `cnt`) VALUES (?, 0, ?) ON DUPLICATE KEY UPDATE `cnt` = `cnt` + VALUES(`cnt`)"],
        );
    }

    #[test]
    fn shadow_mode_reports_what_it_would_do() {
        let e = engine_with(
            "name = \"x\"\ntable = \"hits\"\nkey = [\"slug\"]\nslot_table = \"s\"\nmode = \"shadow\"\n",
            &[col("slug", 0xfd, 0), col("cnt", types::LONG, 1)],
        );
        match decide(&e, "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a'") {
            Decision::Shadow(would) => assert!(matches!(*would, Decision::Rewrite(_))),
            other => panic!("{other:?}"),
        }
        match decide(&e, "UPDATE hits SET cnt = cnt * 2 WHERE slug = 'a'") {
            Decision::Shadow(would) => assert!(matches!(*would, Decision::Reject(_))),
            other => panic!("{other:?}"),
        }
        assert!(matches!(decide(&e, "SELECT 1"), Decision::Passthrough));
    }

    #[test]
    fn a_set_of_some_counters_of_a_rule_with_several_is_refused() {
        let spec: Vec<CounterSpec> = crate::kinds::entries(
            "[[counter]]\nname = \"x\"\ntable = \"hits\"\nkey = [\"slug\"]\ncolumns = [\"cnt\", \"views\"]\nslots = 1\nslot_table = \"hits_slots\"\n",
            "counter",
        )
        .unwrap();
        let e = Engine::new(vec![Arc::new(CounterRule::new(&spec[0]).unwrap())], 1000).unwrap();
        e.provide_metadata(
            0,
            Some("shop"),
            &[
                col("slug", 0xfd, 0x5003),
                col("cnt", types::LONG, 1),
                col("views", types::LONG, 1),
            ],
        );
        let why = reject(&e, "UPDATE hits SET cnt = 0 WHERE slug = 'a'");
        assert!(why.contains("`views`"), "{why}");
        let r = rewrite(&e, "UPDATE hits SET cnt = 0, views = 3 WHERE slug = 'a'");
        assert_sql(
            &r,
            &[
                "DELETE FROM `hits_slots` WHERE slug = 'a'",
                "UPDATE hits SET cnt = 0, views = 3 WHERE slug = 'a'",
            ],
        );
    }

    #[test]
    fn a_draining_rule_sends_increments_to_the_base_and_still_reads_and_clears_slots() {
        let e = engine_with(
            "name = \"x\"\ntable = \"hits\"\nkey = [\"slug\"]\nslot_table = \"hits_slots\"\ndrain = true\n",
            &[col("slug", 0xfd, 0x5003), col("cnt", types::LONG, 1)],
        );
        for sql in [
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a'",
            "INSERT INTO hits (slug, cnt) VALUES ('a', 2) ON DUPLICATE KEY UPDATE cnt = cnt + 2",
        ] {
            assert!(matches!(decide(&e, sql), Decision::Passthrough), "{sql}");
        }
        let r = rewrite(&e, "UPDATE hits SET cnt = 0 WHERE slug = 'a'");
        assert_sql(
            &r,
            &[
                "DELETE FROM `hits_slots` WHERE slug = 'a'",
                "UPDATE hits SET cnt = 0 WHERE slug = 'a'",
            ],
        );
        assert!(matches!(
            decide(&e, "SELECT cnt FROM hits WHERE slug = 'a'"),
            Decision::Rewrite(_)
        ));
        // What the rule refuses it still refuses.
        assert!(reject(
            &e,
            "INSERT INTO hits (slug, cnt) VALUES ('a', 5) ON DUPLICATE KEY UPDATE cnt = 5"
        )
        .contains("cannot be rewritten"));
    }

    #[test]
    fn increments_with_inexact_key_values_are_refused() {
        let e = engine(&["slug"]);
        for v in [
            "0",
            "1e0",
            "TRUE",
            "0x686f6d65",
            "b'1'",
            "1.5",
            "-'a'",
            "CONCAT('a')",
        ] {
            let sql = format!("UPDATE hits SET cnt = cnt + 1 WHERE slug = {v}");
            let msg = reject(&e, &sql);
            assert!(
                msg.contains("key value") || msg.contains("must select"),
                "{sql}: {msg}"
            );
        }
        let long = format!(
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = '{}'",
            "x".repeat(65)
        );
        assert!(reject(&e, &long).contains("longer"));
        // Strings of any spelling that surely fit, and parameters, are rewritten.
        for v in ["'home'", "_utf8mb4'home'", "N'home'", "'a' 'b'", "'it''s'"] {
            let sql = format!("UPDATE hits SET cnt = cnt + 1 WHERE slug = {v}");
            assert!(matches!(decide(&e, &sql), Decision::Rewrite(_)), "{sql}");
        }
    }

    #[test]
    fn integer_keys_must_be_integers_in_range() {
        let e = engine_with(
            "name = \"c\"\ntable = \"hits\"\nkey = [\"id\"]\nslot_table = \"hits_slots\"\n",
            &[col("id", types::TINY, 0x5023), col("cnt", types::LONG, 1)],
        );
        for v in ["5", "255", "0", "-0", "007"] {
            let sql = format!("UPDATE hits SET cnt = cnt + 1 WHERE id = {v}");
            assert!(matches!(decide(&e, &sql), Decision::Rewrite(_)), "{sql}");
        }
        for v in ["256", "1000", "-1", "'5'", "5.0", "99999999999999999999999"] {
            let sql = format!("UPDATE hits SET cnt = cnt + 1 WHERE id = {v}");
            assert!(reject(&e, &sql).contains("key value"), "{sql}");
        }
    }

    #[test]
    fn increments_that_match_nothing_write_nothing() {
        let e = engine(&["slug"]);
        for sql in [
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = NULL",
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home' LIMIT 0",
        ] {
            let r = rewrite(&e, sql);
            assert_sql(&r, &[sql]);
            assert_eq!(r.reply, Reply::OkOf(0));
        }
        let r = rewrite(
            &e,
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home' LIMIT 1",
        );
        assert_sql(
            &r,
            &["INSERT INTO `hits_slots` (`slug`, `slot`, `cnt`) VALUES ('home', 0, 1) ON DUPLICATE KEY UPDATE `cnt` = `cnt` + VALUES(`cnt`)"],
        );
        assert!(reject(
            &e,
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a' LIMIT 1 + 1"
        )
        .contains("LIMIT"));
    }

    #[test]
    fn repeated_increments_add_up_and_deltas_are_integers() {
        let e = engine(&["slug"]);
        let r = rewrite(
            &e,
            "UPDATE hits SET cnt = cnt + 1, cnt = cnt + 2 WHERE slug = 'a'",
        );
        assert_sql(
            &r,
            &["INSERT INTO `hits_slots` (`slug`, `slot`, `cnt`) VALUES ('a', 0, (1) + (2)) ON DUPLICATE KEY UPDATE `cnt` = `cnt` + VALUES(`cnt`)"],
        );
        for d in ["NULL", "1.5", "'1'", "1e0", "TRUE", "0x01", "@v"] {
            let sql = format!("UPDATE hits SET cnt = cnt + {d} WHERE slug = 'a'");
            let msg = reject(&e, &sql);
            assert!(
                msg.contains("integer literals") || msg.contains("cannot be rewritten"),
                "{sql}: {msg}"
            );
        }
    }

    #[test]
    fn unrecognised_clauses_are_refused() {
        let e = engine(&["slug"]);
        for sql in [
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a' RETURNING cnt",
            "DELETE FROM hits WHERE slug = 'a' RETURNING cnt",
            "INSERT INTO hits (slug, cnt) VALUES ('a', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1 RETURNING cnt",
            "INSERT IGNORE INTO hits (slug, cnt) VALUES ('a', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
        ] {
            assert!(reject(&e, sql).contains("cannot be rewritten"), "{sql}");
        }
    }

    /// Statements right at the engine's nesting bound are planned (or refused) on a
    /// thread with tokio's default worker stack; past it they are refused unparsed.
    #[test]
    fn deep_statements_fit_a_worker_stack() {
        let at = crate::rewrite::MAX_NESTING - 10;
        let handle = std::thread::Builder::new()
            .stack_size(crate::WORKER_STACK_BYTES)
            .spawn(move || {
                let e = engine(&["slug"]);
                let shapes: [(&str, &str, &str); 6] = [
                    ("SELECT cnt FROM hits WHERE slug = 'a'", " AND 1", ""),
                    ("SELECT cnt FROM hits WHERE slug = 'a'", " OR 1", ""),
                    ("UPDATE hits SET cnt = cnt + 1", " + 1", " WHERE slug = 'a'"),
                    ("SELECT cnt FROM hits", " UNION SELECT 1", ""),
                    ("SELECT cnt FROM hits WHERE slug = ", "CONCAT(", "'a'"),
                    ("SELECT cnt FROM hits WHERE slug IN ", "(SELECT ", "'a'"),
                ];
                for (head, op, tail) in shapes {
                    for n in [at / 2, at, 100_000] {
                        let mut sql = String::from(head);
                        for _ in 0..n {
                            sql.push_str(op);
                        }
                        sql.push_str(tail);
                        if op.contains('(') {
                            sql.push_str(&")".repeat(n));
                        }
                        let d = decide(&e, &sql);
                        let too_deep =
                            matches!(&d, Decision::Reject(r) if r.reason.contains("deep"));
                        assert_eq!(too_deep, n == 100_000, "{op} x {n}: {d:?}");
                    }
                }
            })
            .unwrap();
        handle.join().unwrap();
    }

    #[test]
    fn non_integer_counters_are_refused() {
        let spec: Vec<CounterSpec> = crate::kinds::entries(
            "[[counter]]\nname = \"x\"\ntable = \"hits\"\nkey = [\"slug\"]\ncolumns = [\"cnt\"]\nslots = 4\nslot_table = \"s\"\n",
            "counter",
        )
        .unwrap();
        let e = Engine::new(vec![Arc::new(CounterRule::new(&spec[0]).unwrap())], 10).unwrap();
        e.provide_metadata(
            0,
            Some("shop"),
            &[col("slug", 0xfd, 0), col("cnt", types::DOUBLE, 0)],
        );
        assert!(reject(&e, "SELECT cnt FROM hits").contains("integer"));
    }

    #[test]
    fn statements_the_parser_cannot_read_are_refused() {
        let e = engine(&["slug"]);
        for sql in [
            "LOAD DATA LOCAL INFILE 'h.csv' INTO TABLE hits",
            "SELECT cnt FROM hits WHERE slug = 'a' INTO @a",
            "SELECT cnt FROM hits INTO OUTFILE '/tmp/x'",
            "SET STATEMENT sql_mode = '' FOR UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a'",
            "SET STATEMENT max_statement_time = 10 FOR UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a'",
        ] {
            let r = reject(&e, sql);
            assert!(r.contains("heatsink rule 'page_hits'"), "{sql}: {r}");
        }
    }

    #[test]
    fn compound_interval_units_are_kept() {
        let e = engine(&["slug"]);
        let r = rewrite(
            &e,
            "SELECT cnt, NOW() - INTERVAL '1:30' HOUR_MINUTE AS t FROM hits WHERE slug = 'a'",
        );
        // The reference: the standard spelling, which the parser reads as it is.
        let want = rewrite(
            &e,
            "SELECT cnt, NOW() - INTERVAL '1:30' HOUR TO MINUTE AS t FROM hits WHERE slug = 'a'",
        );
        let text = String::from_utf8_lossy(&r.statements[0]);
        assert!(text.contains("HOUR_MINUTE"), "{text}");
        let read_back = text.replace("HOUR_MINUTE", "HOUR TO MINUTE");
        assert_eq!(
            crate::rewrite::testutil::parsed(&[read_back]),
            crate::rewrite::testutil::parsed(&want.statements)
        );
    }

    #[test]
    fn set_statement_of_a_rewritable_variable_keeps_the_rewrite() {
        let e = engine(&["slug"]);
        let inc = "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a'";
        let plain = rewrite(&e, inc);
        let prefixed = rewrite(
            &e,
            &format!("SET STATEMENT lock_wait_timeout = 5 FOR {inc}"),
        );
        assert!(prefixed.merge.is_none() && prefixed.aux.is_empty());
        let prefix: &[u8] = b"SET STATEMENT lock_wait_timeout = 5 FOR ";
        let rest: Vec<Vec<u8>> = prefixed
            .statements
            .iter()
            .map(|t| {
                assert!(t.starts_with(prefix), "{}", String::from_utf8_lossy(t));
                t[prefix.len()..].to_vec()
            })
            .collect();
        assert_eq!(
            crate::rewrite::testutil::parsed(&rest),
            crate::rewrite::testutil::parsed(&plain.statements)
        );
    }

    #[test]
    fn select_into_variables_keeps_its_targets() {
        let e = engine(&["slug"]);
        let r = rewrite(
            &e,
            "SELECT cnt, slug INTO @a, @b FROM hits WHERE slug = 'a'",
        );
        assert_sql(
            &r,
            &[&format!(
                "SELECT cnt, slug INTO @a, @b FROM {DERIVED} AS hits WHERE slug = 'a'"
            )],
        );
    }
}
