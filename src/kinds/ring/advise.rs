//! `heatsink advise` for rings: a table that receives inserts and purges that keep
//! the newest N rows per key — a DELETE whose own `ORDER BY … LIMIT`, or a subquery
//! over the same table with `ORDER BY … LIMIT`/`OFFSET` (`id < (SELECT …)`,
//! `NOT IN (SELECT …)`, a join with such a derived table), and an equality on the
//! key. N comes from the purges' literals (samples), else from the reads of a key
//! (rows per call), else it is left for the DBA to set.

use std::collections::BTreeMap;

use sqlparser::ast::{FromTable, Query, Statement, TableFactor};

use crate::advice::{sql, Advice, Entry, Observed, Proposal, Workload};

/// Rows kept per key when nothing observed says.
const DEFAULT_SIZE: u64 = 10;

/// A purge: the table, the key columns, the ordering column.
struct Purge {
    table: String,
    key: Vec<String>,
    order_by: Option<String>,
}

/// The table a DELETE deletes from (an alias resolved), as written.
fn deleted_table(s: &Statement) -> Option<String> {
    let Statement::Delete(d) = s else { return None };
    let from = match &d.from {
        FromTable::WithFromKeyword(f) | FromTable::WithoutKeyword(f) => f,
    };
    let tables = sql::from_tables(from);
    let target = match d.tables.first() {
        None => return tables.first().map(|(t, _)| t.clone()),
        Some(t) => sql::name(t),
    };
    tables
        .iter()
        .find(|(t, a)| {
            a.as_deref()
                .is_some_and(|a| a.eq_ignore_ascii_case(&target))
                || t.eq_ignore_ascii_case(&target)
        })
        .map(|(t, _)| t.clone())
}

/// The subquery of `stmt` over `table` with ORDER BY and LIMIT, if any.
fn ranked_subquery(stmt: &Statement, table: &str) -> Option<Query> {
    sql::queries(stmt).into_iter().find(|q| {
        let over = sql::select_of(q).is_some_and(|s| {
            sql::from_tables(&s.from)
                .iter()
                .any(|(t, _)| sql::last(t).eq_ignore_ascii_case(sql::last(table)))
        });
        over && !sql::order_by(q).is_empty() && sql::limit_offset(q).0.is_some()
    })
}

/// A keep-the-newest purge, if `s` is one.
fn purge(s: &Observed) -> Option<Purge> {
    let stmt = s.stmt.as_ref()?;
    let Statement::Delete(d) = stmt else {
        return None;
    };
    let table = deleted_table(stmt)?;
    let own_key = d
        .selection
        .as_ref()
        .map(sql::equality_columns)
        .unwrap_or_default();
    if !d.order_by.is_empty() && d.limit.is_some() {
        let order_by = sql::column(&d.order_by[0].expr).map(|(_, c)| c);
        if own_key.is_empty() {
            return None;
        }
        return Some(Purge {
            table,
            key: own_key.into_iter().map(|(_, c)| c).collect(),
            order_by,
        });
    }
    let q = ranked_subquery(stmt, &table)?;
    let inner = sql::select_of(&q)?;
    let key: Vec<String> = inner
        .selection
        .as_ref()
        .map(sql::equality_columns)
        .unwrap_or_default()
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    let key = if key.is_empty() {
        own_key.into_iter().map(|(_, c)| c).collect()
    } else {
        key
    };
    if key.is_empty() {
        return None;
    }
    let order_by = sql::order_by(&q)
        .first()
        .and_then(|o| sql::column(&o.expr))
        .map(|(_, c)| c);
    Some(Purge {
        table,
        key,
        order_by,
    })
}

/// N from a purge as sent: `LIMIT n` keeps n, `LIMIT 1 OFFSET n` (`LIMIT n, 1`)
/// keeps n + 1.
fn kept(sample: &str, table: &str) -> Option<u64> {
    let stmt = crate::rewrite::parse_statements(sample).ok()?.pop()?;
    if let Some(q) = ranked_subquery(&stmt, table) {
        let (limit, offset) = sql::limit_offset(&q);
        return match offset.and_then(sql::integer) {
            Some(o) => Some(o + 1),
            None => limit.and_then(sql::integer),
        };
    }
    None
}

/// Whether `s` inserts into `table`.
fn inserts_into(s: &Observed, table: &str) -> bool {
    match &s.stmt {
        Some(Statement::Insert(i)) => match &i.table {
            sqlparser::ast::TableObject::TableName(n) => {
                sql::last(&sql::name(n)).eq_ignore_ascii_case(sql::last(table))
            }
            _ => false,
        },
        _ => false,
    }
}

/// Reads of the newest rows of one key: `… WHERE key = ? ORDER BY … LIMIT ?`.
fn newest_read(s: &Observed, key: &[String]) -> bool {
    let Some(Statement::Query(q)) = &s.stmt else {
        return false;
    };
    let Some(sel) = sql::select_of(q) else {
        return false;
    };
    let eq = sel
        .selection
        .as_ref()
        .map(sql::equality_columns)
        .unwrap_or_default();
    key.iter()
        .all(|k| eq.iter().any(|(_, c)| c.eq_ignore_ascii_case(k)))
        && !sql::order_by(q).is_empty()
        && sql::limit_offset(q).0.is_some()
        && sel.from.len() == 1
        && sel.from[0].joins.is_empty()
        && matches!(sel.from[0].relation, TableFactor::Table { .. })
}

/// Finds keep-the-newest logs.
pub fn advise(w: &Workload) -> Advice {
    let mut out = Advice::default();
    let mut groups: BTreeMap<String, (Vec<&Observed>, Purge)> = BTreeMap::new();
    for s in &w.statements {
        let Some(p) = purge(s) else { continue };
        let id = format!(
            "{}.{}",
            w.db_of(s, &p.table).unwrap_or_default(),
            sql::last(&p.table)
        )
        .to_ascii_lowercase();
        groups
            .entry(id)
            .or_insert_with(|| (Vec::new(), p))
            .0
            .push(s);
    }
    for (_, (purges, p)) in groups {
        let first = purges[0];
        let inserts: Vec<&Observed> = w
            .on_table(first, &p.table)
            .filter(|s| inserts_into(s, &p.table))
            .collect();
        if inserts.is_empty() {
            continue;
        }
        let reads: Vec<&Observed> = w
            .on_table(first, &p.table)
            .filter(|s| newest_read(s, &p.key))
            .collect();
        let mut answered: Vec<&Observed> = inserts.clone();
        answered.extend(purges.iter().copied());
        answered.extend(reads.iter().copied());
        if !w.matters(&answered) {
            continue;
        }
        let mut caveats = Vec::new();
        let from_samples = purges
            .iter()
            .flat_map(|s| s.samples.iter())
            .filter_map(|t| kept(t, &p.table))
            .max();
        let from_reads = reads
            .iter()
            .map(|s| s.rows_per_call().ceil() as u64)
            .max()
            .filter(|n| *n > 0);
        let size = match (from_samples, from_reads) {
            (Some(n), _) => n,
            (None, Some(n)) => {
                caveats.push(format!(
                    "size {n}: the most rows a read of one key returned on average; the purges' N was not observed (no samples), set it to what they keep"
                ));
                n
            }
            (None, None) => {
                caveats.push(format!(
                    "size {DEFAULT_SIZE} is a placeholder: the purges' N was not observed; set it to what they keep"
                ));
                DEFAULT_SIZE
            }
        };
        let info = w.table(first, &p.table);
        if let Some(t) = info {
            if let Some(c) = p.key.iter().find(|k| t.column(k).is_none()) {
                out.notes.push(format!(
                    "ring: the purges of {} keep rows per {c}, which is not a column of it: no rule proposed",
                    t.name
                ));
                continue;
            }
        } else if w.schema_known {
            continue;
        }
        let logical = w.rule_table(first, &p.table);
        let base = crate::advice::ident(sql::last(&logical));
        let name = format!("{base}_latest");
        let ring_table = format!("{logical}_ring");
        // The log's own id orders rows already; any other column is the order.
        let order_by = p.order_by.clone().filter(|c| {
            info.and_then(|t| t.auto_increment())
                .is_none_or(|ai| !ai.name.eq_ignore_ascii_case(c))
        });
        let mut e = Entry::new("ring")
            .kv("name", name.clone(), "")
            .kv("table", logical.clone(), "the log")
            .list("key", &p.key, "one ring per key")
            .kv("size", size as i64, "rows kept per key")
            .kv(
                "ring_table",
                ring_table.clone(),
                "created by heatsink migrate",
            );
        if let Some(o) = &order_by {
            e = e.kv(
                "order_by",
                o.clone(),
                "which rows are the newest when migrate backfills",
            );
        }
        let effect = "bench/results/ring.md (keep the last 5 per key, group commit on): 1.32 × \
            append-and-purge's inserts/s at 16 connections and 4.22 × at 64 (p95 3.0 ms \
            instead of 36 ms, constant table size, no purge deadlocks); at 1 connection \
            0.66 ×"
            .to_string();
        let mut prop = Proposal::new(
            w,
            "ring",
            name,
            logical.clone(),
            e.finish(),
            &answered,
            1.32,
            effect,
        )
        .set("key", &p.key)
        .set("size", size);
        prop.evidence = vec![
            w.load_line(&answered),
            format!(
                "{} insert shape(s) ({} executions) and {} purge shape(s) keeping the newest rows per ({}) ({} executions)",
                inserts.len(),
                inserts.iter().map(|s| s.row.count_star).sum::<u64>(),
                purges.len(),
                p.key.join(", "),
                purges.iter().map(|s| s.row.count_star).sum::<u64>()
            ),
            w.size_line(first, &p.table),
        ];
        let failed: u64 = purges
            .iter()
            .map(|s| s.row.errors_with(1213) + s.row.errors_with(1205))
            .sum();
        if failed > 0 {
            prop.evidence.push(format!(
                "{failed} purge(s) failed with a deadlock or lock wait timeout"
            ));
        }
        if let Some(n) = from_samples {
            prop.evidence.push(format!(
                "the purges as sent keep the newest {n} rows per key"
            ));
        }
        // A purge deletes some of a key's rows, which the rule refuses: say so
        // wherever the proposal is read (the migrate lines below give way to the
        // real dry run when the schema is known).
        caveats.push(format!(
            "the purges are refused under the rule (ERROR 1105: a DELETE of some of a key's rows); \
             the ring keeps the newest {size} rows per key by itself: stop sending them \
             (the purge job, or the application's call) when the rule is put in force"
        ));
        prop.caveats = caveats;
        prop.migrate = vec![
            format!("table {ring_table}: the log's columns, slot and seq, PRIMARY KEY (key, slot), backfilled with each key's newest rows"),
            format!("table {logical}_ring_seq: each key's last sequence number"),
            format!("triggers numbering the ring's rows and copying rows still appended to {logical} directly"),
        ];
        out.proposals.push(prop);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advice::testutil::{row, table, workload};

    fn log() -> crate::advice::TableInfo {
        table(
            "visits",
            5000,
            &[
                ("id", "bigint auto"),
                ("uid", "int"),
                ("visitor", "int"),
                ("at", "datetime"),
            ],
            &[&["id"]],
        )
    }

    #[test]
    fn purges_keeping_the_newest_make_a_ring() {
        for purge in [
            "DELETE l FROM visits l JOIN (SELECT uid, id FROM visits WHERE uid = ? ORDER BY id DESC LIMIT ? OFFSET ?) t ON l.uid = t.uid AND l.id < t.id",
            "DELETE FROM visits WHERE uid = ? AND id NOT IN (SELECT id FROM (SELECT id FROM visits WHERE uid = ? ORDER BY id DESC LIMIT ?) x)",
            "DELETE FROM visits WHERE uid = ? AND id < (SELECT id FROM (SELECT id FROM visits WHERE uid = ? ORDER BY id DESC LIMIT ?, ?) x)",
            "DELETE FROM visits WHERE uid = ? ORDER BY id LIMIT ?",
        ] {
            let mut w = workload(
                vec![
                    row("INSERT INTO visits (uid, visitor, at) VALUES (?, ?, NOW())", 1000, 50_000),
                    row(purge, 100, 40_000),
                ],
                vec![log()],
            );
            w.statements[1].samples = vec![purge
                .replacen("uid = ?", "uid = 3", 2)
                .replace("LIMIT ? OFFSET ?", "LIMIT 1 OFFSET 4")
                .replace("LIMIT ?, ?", "LIMIT 4, 1")
                .replace("LIMIT ?", "LIMIT 5")];
            let a = advise(&w);
            assert_eq!(a.proposals.len(), 1, "{purge}: {a:?}");
            let p = &a.proposals[0];
            assert_eq!(p.settings["key"], serde_json::json!(["uid"]), "{purge}");
            if !purge.ends_with("ORDER BY id LIMIT ?") {
                assert_eq!(p.settings["size"], serde_json::json!(5), "{purge}");
            }
            assert!(!p.toml.contains("order_by"), "{}", p.toml);
            // The rule refuses the purges: the proposal says to stop them.
            assert!(
                p.caveats.iter().any(|c| c.contains("purges are refused")),
                "{purge}: {:?}",
                p.caveats
            );
        }
    }

    #[test]
    fn plain_inserts_and_purges_by_age_are_not_rings() {
        let w = workload(
            vec![
                row(
                    "INSERT INTO visits (uid, visitor, at) VALUES (?, ?, NOW())",
                    1000,
                    50_000,
                ),
                row(
                    "DELETE FROM visits WHERE at < NOW() - INTERVAL ? DAY",
                    10,
                    40_000,
                ),
            ],
            vec![log()],
        );
        assert!(advise(&w).proposals.is_empty());
    }
}
