//! Group commit of inserts into the log (`coalesce`, on by default): concurrent
//! autocommit inserts into the log become one multi-row insert
//! ([`crate::kinds::inserts`]). The rollups' triggers still run once per row, but in
//! one statement and one commit for the whole batch, instead of one round trip,
//! statement and commit per insert. Each client is answered as its own insert would
//! have been: its rows, its first row's id (`RETURNING`), its own warnings.
//!
//! Only plain inserts merge: `INSERT [INTO] log (columns…) VALUES (…), …` or
//! `INSERT [INTO] log SET …` whose values are literals, parameters or clock
//! functions, that leave the AUTO_INCREMENT column to the server, without `IGNORE`,
//! `ON DUPLICATE KEY UPDATE`, priorities or hints. Every other write to the log
//! passes through unchanged, byte for byte.

use sqlparser::ast::{AssignmentTarget, Insert, SetExpr, Statement, TableObject};

use super::rule::RollupRule;
use crate::kinds::inserts::{session_independent, Flavor, InsertPieces, Inserts};
use crate::rewrite::merge::MergeMetric;
use crate::rewrite::shape::{column_def_name, eq, last_ident, unsupported_clauses};
use crate::rewrite::{parse_statements, Affected, Plan, PlanContext, Refusal, Reply};
use crate::rules::spec::quote;

/// Log rows inserted as part of a merged write.
pub static METRIC: MergeMetric = MergeMetric {
    name: "heatsink_rollup_merged_rows_total",
    help: "Log rows of rollup rules inserted as part of a merged write.",
};

/// The rollup's names and answers. A log insert running alone answers with its
/// own OK packet's id (no `RETURNING` needed).
static FLAVOR: Flavor = Flavor {
    name: "log insert",
    name_alone: "log insert, alone",
    explain: "concurrent autocommit inserts into the log may be merged into one multi-row insert (the rollups' triggers run per row, in one statement and one commit), answered after it committed (coalesce)",
    metric: &METRIC,
    returning_alone: false,
    lanes: LANES,
};

/// Merged log inserts in flight at once. One merged write at a time would run every
/// row's triggers on one connection; a few lanes keep the server's cores busy. A
/// power of two no larger than the default `slots`, so that leaders of different
/// lanes (`backend id % LANES`) write different slots (`CONNECTION_ID() % slots`).
const LANES: u32 = 4;

/// `AUTO_INCREMENT` in a column definition's flags.
const AUTO_INCREMENT_FLAG: u16 = 0x0200;

/// The plan of an insert into the log that may merge with others, or `None`: the
/// insert passes through unchanged.
pub(super) fn plan_insert(
    rule: &RollupRule,
    ins: &Insert,
    stmt: &Statement,
    ctx: &PlanContext<'_>,
) -> Result<Option<Plan>, Refusal> {
    let TableObject::TableName(name) = &ins.table else {
        return Ok(None);
    };
    let plain = rule.coalesce
        && rule.logical.named_by(name, ctx)
        && !ins.ignore
        && ins.on.is_none()
        && !ins.replace_into
        && ins.priority.is_none()
        && ins.optimizer_hints.is_empty()
        && unsupported_clauses(stmt).is_ok();
    if !plain {
        return Ok(None);
    }
    let (cols, rows) = if !ins.assignments.is_empty() {
        let mut cols = Vec::new();
        let mut row = Vec::new();
        for a in &ins.assignments {
            let AssignmentTarget::ColumnName(c) = &a.target else {
                return Ok(None);
            };
            cols.push(last_ident(c));
            row.push(&a.value);
        }
        (cols, vec![row])
    } else {
        let Some(SetExpr::Values(v)) = ins.source.as_deref().map(|q| q.body.as_ref()) else {
            return Ok(None);
        };
        let cols: Vec<String> = ins.columns.iter().map(last_ident).collect();
        let rows: Vec<Vec<&sqlparser::ast::Expr>> =
            v.rows.iter().map(|r| r.content.iter().collect()).collect();
        (cols, rows)
    };
    let uniform = !cols.is_empty() && rows.iter().all(|r| r.len() == cols.len());
    if !uniform || !rows.iter().flatten().all(|e| session_independent(e)) {
        return Ok(None);
    }
    let meta = rule.logical.columns(ctx)?;
    if !cols
        .iter()
        .all(|c| meta.iter().any(|d| eq(&column_def_name(d), c)))
    {
        // The server's error for an unknown column, from the statement itself.
        return Ok(None);
    }
    let ai_column = meta
        .iter()
        .find(|d| d.flags & AUTO_INCREMENT_FLAG != 0)
        .map(column_def_name);
    if ai_column
        .as_deref()
        .is_some_and(|ai| cols.iter().any(|c| eq(c, ai)))
    {
        // An id of the client's own: a merged write could not report it as the
        // server would (and a duplicate would fail the whole batch).
        return Ok(None);
    }
    let prefix = format!(
        "INSERT INTO {name} ({}) VALUES ",
        cols.iter().map(|c| quote(c)).collect::<Vec<_>>().join(", ")
    );
    let tuples: Vec<String> = rows
        .iter()
        .map(|r| {
            let vals: Vec<String> = r.iter().map(ToString::to_string).collect();
            format!("({})", vals.join(", "))
        })
        .collect();
    let tuples = tuples.join(", ");
    let statements = parse_statements(&format!("{prefix}{tuples}")).map_err(|e| {
        Refusal::internal(format!(
            "internal error: the log insert does not parse ({e})"
        ))
    })?;
    let n = rows.len() as u64;
    // Merged parts are ordered by their first row's dimensions, so that concurrent
    // merged writes reach the rollups' rows in one order.
    let order: Vec<String> = rule
        .logical
        .key()
        .iter()
        .filter_map(|k| cols.iter().position(|c| eq(c, k)))
        .map(|i| rows[0][i].to_string())
        .collect();
    let aux = InsertPieces {
        prefix: &prefix,
        tuples: &tuples,
        suffix: &String::new(),
        order: &order.join(", "),
        rows: &n.to_string(),
        ai_column: &ai_column.as_deref().map(quote).unwrap_or_default(),
    }
    .to_aux();
    Ok(Some(Plan {
        statements,
        reply: Reply::Ok {
            affected_rows: Affected::Fixed(n),
            info: (n > 1).then(|| format!("Records: {n}  Duplicates: 0  Warnings: 0")),
            last_insert_id: Some(0),
        },
        aux,
        // The rollups' triggers are heatsink's own, on the log itself.
        merge: Some(Inserts::merger(
            true,
            &FLAVOR,
            rule.logical.merge_table(rule.logical.name(), ctx, true),
        )),
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{engine_of, DAY_RULE};
    use crate::rewrite::testutil::{assert_sql, decide, rewrite};
    use crate::rewrite::{Decision, Reply};

    #[test]
    fn plain_inserts_merge() {
        let e = engine_of(DAY_RULE);
        let r = rewrite(
            &e,
            "INSERT INTO plays (created_at, track_id, country) VALUES (NOW(), 7, 'DE'), (NOW(), 8, NULL)",
        );
        assert_sql(
            &r,
            &["INSERT INTO plays (`created_at`, `track_id`, `country`) VALUES (NOW(), 7, 'DE'), (NOW(), 8, NULL)"],
        );
        let merge = r.merge.as_ref().unwrap();
        let (target, part) = merge.part(&r.aux).unwrap();
        assert_eq!(
            target[0],
            b"INSERT INTO plays (`created_at`, `track_id`, `country`) VALUES "
        );
        assert_eq!(part.items, 2);
        assert_eq!(part.order, b"7, 'DE'");
        // The id of the log's AUTO_INCREMENT column for every merged row; a log
        // insert running alone answers with its own OK packet.
        assert_eq!(merge.returning(&r.aux), Some(&b"`id`"[..]));
        assert_eq!(merge.returning_alone(&r.aux), None);
        assert!(matches!(
            r.reply,
            Reply::Ok {
                last_insert_id: Some(0),
                ..
            }
        ));
        let set = rewrite(&e, "INSERT plays SET track_id = 7, created_at = NOW()");
        assert_sql(
            &set,
            &["INSERT INTO plays (`track_id`, `created_at`) VALUES (7, NOW())"],
        );
    }

    #[test]
    fn other_inserts_pass_through() {
        let e = engine_of(DAY_RULE);
        for sql in [
            "INSERT INTO plays (id, track_id) VALUES (5, 7)",
            "INSERT IGNORE INTO plays (track_id) VALUES (7)",
            "INSERT INTO plays (track_id) VALUES (7) ON DUPLICATE KEY UPDATE track_id = 8",
            "REPLACE INTO plays (track_id) VALUES (7)",
            "INSERT LOW_PRIORITY INTO plays (track_id) VALUES (7)",
            "INSERT INTO plays VALUES (1, NOW(), 7, 'DE', 1)",
            "INSERT INTO plays (track_id) SELECT track_id FROM plays",
            "INSERT INTO plays (track_id) VALUES (@t)",
            "INSERT INTO plays (track_id) VALUES (LAST_INSERT_ID())",
            "INSERT INTO plays (nope) VALUES (1)",
            "INSERT INTO plays (track_id, country) VALUES (7)",
        ] {
            assert!(matches!(decide(&e, sql), Decision::Passthrough), "{sql}");
        }
        let off = engine_of(&format!("{DAY_RULE}coalesce = false\n"));
        let sql = "INSERT INTO plays (track_id) VALUES (7)";
        assert!(matches!(decide(&off, sql), Decision::Passthrough));
    }
}
