//! `heatsink advise` for counters: `UPDATE t SET c = c ± n WHERE key = ?` on a key
//! that is hot (its most frequent literal carries at least `hot_share` of the
//! executions) or whose updates wait for locks or deadlock (errors 1205/1213 on the
//! statement, the table in the server's latest deadlock).

use std::collections::BTreeMap;

use sqlparser::ast::{AssignmentTarget, BinaryOperator, Expr, Statement, TableFactor};

use crate::advice::{sql, Advice, Entry, Observed, Proposal, Workload};

/// What one increment statement says: the table, the key columns, the counter
/// columns.
struct Increment {
    table: String,
    key: Vec<String>,
    columns: Vec<String>,
}

/// `c = c + v`, `c = v + c`, `c = c - v` with `v` a literal or `?`: the column.
fn increment(target: &AssignmentTarget, value: &Expr) -> Option<String> {
    let AssignmentTarget::ColumnName(n) = target else {
        return None;
    };
    let col = sql::name(n);
    let col = sql::last(&col).to_string();
    let Expr::BinaryOp { left, op, right } = value else {
        return None;
    };
    let same = |e: &Expr| sql::column(e).is_some_and(|(_, c)| c.eq_ignore_ascii_case(&col));
    let ok = match op {
        BinaryOperator::Plus => {
            (same(left) && sql::is_value(right)) || (same(right) && sql::is_value(left))
        }
        BinaryOperator::Minus => same(left) && sql::is_value(right),
        _ => false,
    };
    ok.then_some(col)
}

/// An increment statement's parts, if `s` is one.
fn shape(s: &Observed) -> Option<Increment> {
    let Some(Statement::Update(u)) = &s.stmt else {
        return None;
    };
    if !u.table.joins.is_empty() || u.from.is_some() || u.returning.is_some() {
        return None;
    }
    let TableFactor::Table { name, .. } = &u.table.relation else {
        return None;
    };
    let columns = u
        .assignments
        .iter()
        .map(|a| increment(&a.target, &a.value))
        .collect::<Option<Vec<String>>>()?;
    let key = match &u.selection {
        None => Vec::new(),
        Some(w) => sql::conjuncts(w)
            .into_iter()
            .map(|c| sql::equality(c).map(|((_, col), _)| col))
            .collect::<Option<Vec<String>>>()?,
    };
    Some(Increment {
        table: sql::name(name),
        key,
        columns,
    })
}

/// Finds hot counters.
pub fn advise(w: &Workload) -> Advice {
    let mut out = Advice::default();
    // (db.table, key) → statements and their counter columns
    // statements, counter columns, the table as written
    type Group<'a> = (Vec<&'a Observed>, Vec<String>, String);
    let mut groups: BTreeMap<(String, Vec<String>), Group> = BTreeMap::new();
    for s in &w.statements {
        let Some(inc) = shape(s) else { continue };
        let mut key: Vec<String> = inc.key.iter().map(|k| k.to_ascii_lowercase()).collect();
        key.sort();
        let db = w.db_of(s, &inc.table).unwrap_or_default();
        let id = (
            format!("{db}.{}", sql::last(&inc.table)).to_ascii_lowercase(),
            key,
        );
        let g = groups
            .entry(id)
            .or_insert_with(|| (Vec::new(), Vec::new(), inc.table.clone()));
        g.0.push(s);
        for c in inc.columns {
            if !g.1.iter().any(|x| x.eq_ignore_ascii_case(&c)) {
                g.1.push(c);
            }
        }
        // Keep the key as the statement spelt it.
        if g.0.len() == 1 {
            g.2 = inc.table;
        }
    }
    for ((_, _), (stmts, columns, table)) in groups {
        let first = stmts[0];
        let key = shape(first).map(|i| i.key).unwrap_or_default();
        let mut evidence = vec![w.load_line(&stmts)];
        let mut hot = key.is_empty();
        if key.is_empty() {
            evidence.push("no WHERE: every increment writes the same row".into());
        }
        for s in &stmts {
            if let Some(hk) = &s.hot_keys {
                let share = hk.top_share(s.row.count_star);
                if share >= w.thresholds.hot_share
                    && key.iter().any(|k| k.eq_ignore_ascii_case(&hk.column))
                {
                    hot = true;
                    if let Some((lit, n)) = hk.top.first() {
                        evidence.push(format!(
                            "hot key {} = '{lit}': {} of its {} executions ({n}), about {} distinct keys",
                            hk.column,
                            crate::advice::pct(share),
                            s.row.count_star,
                            hk.distinct
                        ));
                    }
                }
            }
            let (deadlocks, waits) = (s.row.errors_with(1213), s.row.errors_with(1205));
            if deadlocks + waits > 0 {
                hot = true;
                evidence.push(format!(
                    "{deadlocks} deadlock(s) (1213) and {waits} lock wait timeout(s) (1205) among its errors"
                ));
            }
        }
        if w.deadlocked(first, &table) {
            hot = true;
            evidence.push(format!(
                "the server's latest detected deadlock involved {table}"
            ));
        }
        if !hot || !w.matters(&stmts) {
            continue;
        }
        if let Some(waits) = w.server.row_lock_waits.filter(|n| *n > 0) {
            evidence.push(format!(
                "server: Innodb_row_lock_waits = {waits}, Innodb_row_lock_time = {} ms",
                w.server.row_lock_time_ms.unwrap_or(0)
            ));
        }
        if let Some(t) = w.table(first, &table) {
            if !key.is_empty() && !t.is_unique(&key) {
                out.notes.push(format!(
                    "counter: {} is incremented by ({}), which is not its primary or a unique key: no rule proposed",
                    t.name,
                    key.join(", ")
                ));
                continue;
            }
            if let Some(c) = columns
                .iter()
                .find(|c| !t.column(c).is_some_and(|col| col.is_integer()))
            {
                out.notes.push(format!(
                    "counter: {}.{c} is incremented but is not an integer column: no rule proposed",
                    t.name
                ));
                continue;
            }
        } else if w.schema_known {
            continue;
        }
        let logical = w.rule_table(first, &table);
        let base = crate::advice::ident(sql::last(&logical));
        let name = format!("{base}_{}", crate::advice::ident(&columns[0]));
        let slot_table = format!("{logical}_slots");
        let toml = Entry::new("counter")
            .kv("name", name.clone(), "")
            .kv("table", logical.clone(), "")
            .list(
                "key",
                &key,
                "the statements' WHERE: a primary or unique key",
            )
            .list("columns", &columns, "the columns incremented")
            .kv("slots", 16i64, "slot rows per counter")
            .kv(
                "slot_table",
                slot_table.clone(),
                "created by heatsink migrate",
            )
            .finish();
        let effect = "bench/results/counter.md (one hot key, 16 slots, group commit on): \
            2.93 × the single row's increments/s at 16 connections and 6.56 × at 64 \
            (p99 1.7 ms instead of 9.1 ms); at 1 connection 0.77 × (no contention: the \
            proxy's hop)"
            .to_string();
        let mut p = Proposal::new(w, "counter", name, logical, toml, &stmts, 2.93, effect)
            .set("key", &key)
            .set("columns", &columns);
        p.evidence = evidence;
        p.migrate = vec![
            format!(
                "table {slot_table}: the key columns, a slot column and the counter columns, PRIMARY KEY (key, slot)"
            ),
            format!("trigger on {slot_table} that creates the logical row of a new key"),
        ];
        out.proposals.push(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advice::testutil::{hot, row, table, workload};

    fn hits() -> crate::advice::TableInfo {
        table(
            "hits",
            100,
            &[
                ("id", "int auto"),
                ("slug", "varchar"),
                ("cnt", "int"),
                ("note", "text"),
            ],
            &[&["id"], &["slug"]],
        )
    }

    #[test]
    fn a_hot_key_is_a_counter() {
        let w = workload(
            vec![
                hot(
                    row(
                        "UPDATE `hits` SET `cnt` = `cnt` + ? WHERE `slug` = ?",
                        1000,
                        90_000,
                    ),
                    "slug",
                    40,
                    &[("home", 800), ("about", 20)],
                ),
                row("SELECT `cnt` FROM `hits` WHERE `slug` = ?", 100, 1000),
            ],
            vec![hits()],
        );
        let a = advise(&w);
        assert_eq!(a.proposals.len(), 1, "{a:?}");
        let p = &a.proposals[0];
        assert_eq!((p.kind, p.table.as_str()), ("counter", "hits"));
        assert_eq!(p.settings["key"], serde_json::json!(["slug"]));
        assert!(p.toml.contains("slot_table = \"hits_slots\""), "{}", p.toml);
        assert!(
            p.evidence.iter().any(|e| e.contains("'home'")),
            "{:?}",
            p.evidence
        );
    }

    #[test]
    fn deadlocks_make_a_counter_without_hot_keys() {
        let mut r = row("UPDATE hits SET cnt = cnt - 1 WHERE slug = ?", 500, 50_000);
        r.error_codes = Some("1213:4".into());
        let a = advise(&workload(vec![r], vec![hits()]));
        assert_eq!(a.proposals.len(), 1);
    }

    #[test]
    fn cold_updates_and_other_shapes_are_not_counters() {
        let w = workload(
            vec![
                hot(
                    row("UPDATE hits SET cnt = cnt + ? WHERE slug = ?", 1000, 90_000),
                    "slug",
                    1000,
                    &[("a", 3), ("b", 2)],
                ),
                hot(
                    row("UPDATE hits SET cnt = cnt * ? WHERE slug = ?", 1000, 90_000),
                    "slug",
                    2,
                    &[("home", 900)],
                ),
                hot(
                    row("UPDATE hits SET note = ? WHERE slug = ?", 1000, 90_000),
                    "slug",
                    2,
                    &[("home", 900)],
                ),
            ],
            vec![hits()],
        );
        assert!(advise(&w).proposals.is_empty());
        // A hot key that is not unique: a note, no rule.
        let mut t = hits();
        t.unique.truncate(1);
        let w = workload(
            vec![hot(
                row("UPDATE hits SET cnt = cnt + ? WHERE slug = ?", 1000, 90_000),
                "slug",
                2,
                &[("home", 900)],
            )],
            vec![t],
        );
        let a = advise(&w);
        assert!(a.proposals.is_empty());
        assert_eq!(a.notes.len(), 1, "{a:?}");
    }
}
