//! The timeline planner (pull): the friends-timeline read answered from each
//! followee's newest messages instead of all of them.
//!
//! The read, in its usual spellings (`JOIN … ON` or a comma join with the condition
//! in `WHERE`; any column list):
//!
//! ```sql
//! SELECT message.* FROM message JOIN follower ON message.user_id = follower.follower_id
//!  WHERE follower.user_id = ? [AND message.id < ?] ORDER BY message.id DESC LIMIT n [OFFSET k]
//! ```
//!
//! reads every message of every followee and sorts them. Its answer is the `n + k`
//! newest join rows; the newest message of each of the `n + k` followees with the
//! newest messages are `n + k` join rows, so every row of the answer has an id at
//! least the `(n + k)`-th largest of the followees' newest ids. The rewrite adds
//! that bound:
//!
//! ```sql
//! SELECT <as written> FROM (SELECT COALESCE((SELECT hs_x.hs_mx FROM (
//!     SELECT (SELECT hs_m.id FROM message AS hs_m
//!              WHERE hs_m.user_id = hs_f.follower_id [AND hs_m.id < ?]
//!              ORDER BY hs_m.id DESC LIMIT 1) AS hs_mx
//!       FROM follower AS hs_f WHERE hs_f.user_id = ?
//!      ORDER BY hs_mx DESC LIMIT 1 OFFSET n + k - 1) AS hs_x), 0) AS hs_t) AS hs_t,
//!   follower STRAIGHT_JOIN message [ON <the join condition>]
//!  WHERE (<the WHERE as written>) AND message.id >= hs_t.hs_t
//!  ORDER BY message.id DESC LIMIT n [OFFSET k]
//! ```
//!
//! The one-row derived table is read while the server optimises the statement, so
//! the bound is a constant for the `(author, id)` index: one index dive per followee
//! for the bound (`ORDER BY id DESC LIMIT 1`, not `MAX(id)`: a correlated `MAX`
//! reads every message of the followee) and the rows from the bound up per followee,
//! in one round trip. `STRAIGHT_JOIN` keeps the follows first: left to itself
//! MariaDB may scan every message above the bound by primary key instead (measured
//! in `docs/design.md`). Fewer than `n + k` followees with messages: the bound is 0.
//!
//! ## Push and hybrid: the bound from the mailbox
//!
//! The mailbox holds, per reader, ids of messages on their timeline (kept by
//! triggers, see `schema.rs`): never an id that is not on it, though it may lack
//! some (a hybrid's high-fanout authors, entries trimmed to `mailbox_size`, messages
//! older than the backfill). The `(n + k)`-th largest id of a subset of the timeline
//! is at most the timeline's own, so it is a bound as good as pull's and usually
//! much tighter (exact when the mailbox holds the whole page):
//!
//! ```sql
//! … COALESCE((SELECT hs_b.hs_message FROM mailbox AS hs_b WHERE hs_b.hs_reader = ?
//!               [AND hs_b.hs_message < ?] ORDER BY hs_b.hs_message DESC
//!               LIMIT 1 OFFSET n + k - 1),
//!            <pull's bound>, 0) …
//! ```
//!
//! `COALESCE` evaluates its arguments in order and stops at the first that is not
//! NULL: pull's bound is computed only when the mailbox holds fewer than `n + k`
//! entries below the page (a new reader, an old page). The answer always comes
//! from the message and follow tables themselves, so the mailbox can make a read
//! slower but never change it.

use sqlparser::ast::{
    BinaryOperator, Expr, JoinConstraint, JoinOperator, LimitClause, ObjectName, OrderByKind,
    Query, SelectItem, SetExpr, Statement, TableFactor, TableWithJoins,
};

use super::schema::{MAILBOX_MESSAGE, MAILBOX_READER};
use super::spec::{Serve, TimelineSpec};
use crate::kinds::logical::LogicalTable;
use crate::rewrite::shape::{conjuncts, eq, plain_table};
use crate::rewrite::{parse_statements, Plan, PlanContext, Refusal, Rule, TableName};
use crate::rules::spec::quote;
use crate::wire::resultset::ColumnDef;

/// `AUTO_INCREMENT` in a column definition's flags.
const AUTO_INCREMENT_FLAG: u16 = 0x0200;

/// Rows of a page (`n + k`) above which the read is not rewritten (its bound would
/// read as many rows per followee as the plain read).
const MAX_PAGE_END: i64 = 10_000;

/// A `[[timeline]]` rule in pull mode, ready to plan statements.
pub struct TimelineRule {
    name: String,
    /// The message table, with its author column as key (metadata: its id).
    messages: LogicalTable,
    /// The follow table, with its reader and author columns as key.
    follows: LogicalTable,
    /// Both tables, for the pre-filter.
    tables: Vec<TableName>,
    author: String,
    reader: String,
    followed: String,
    /// Push and hybrid: the mailbox table.
    mailbox: Option<TableName>,
    mode: Serve,
    shadow: bool,
}

impl TimelineRule {
    /// Builds the rule from a validated spec.
    pub fn new(spec: &TimelineSpec) -> Result<Self, String> {
        spec.validate()?;
        let messages = TableName::parse(&spec.messages)?;
        let follows = TableName::parse(&spec.follows)?;
        Ok(TimelineRule {
            name: spec.name.clone(),
            messages: LogicalTable::new(messages.clone(), vec![spec.message_author.clone()]),
            follows: LogicalTable::new(
                follows.clone(),
                vec![spec.follow_reader.clone(), spec.follow_author.clone()],
            ),
            tables: vec![messages, follows],
            author: spec.message_author.clone(),
            reader: spec.follow_reader.clone(),
            followed: spec.follow_author.clone(),
            mailbox: spec.mailbox_table(),
            mode: spec.mode,
            shadow: spec.shadow,
        })
    }

    /// Whether the top SELECT of `q` reads both tables (a timeline read this rule
    /// exists for, served or not).
    fn reads_both(&self, q: &Query, ctx: &PlanContext<'_>) -> bool {
        let SetExpr::Select(sel) = q.body.as_ref() else {
            return false;
        };
        let names: Vec<&ObjectName> = sel
            .from
            .iter()
            .flat_map(|t| std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)))
            .filter_map(|f| match f {
                TableFactor::Table { name, .. } => Some(name),
                _ => None,
            })
            .collect();
        names.iter().any(|n| self.messages.named_by(n, ctx))
            && names.iter().any(|n| self.follows.named_by(n, ctx))
    }

    fn plan_read(&self, q: &Query, ctx: &PlanContext<'_>) -> Result<Option<Plan>, Refusal> {
        let Some(shape) = Shape::of(self, q, ctx)? else {
            return Ok(self.reads_both(q, ctx).then(|| {
                Plan::fallback("the read of both tables is not a shape the timeline answers")
            }));
        };
        let sql = shape.sql(self, q);
        let statements = parse_statements(&sql).map_err(|e| {
            Refusal::internal(format!(
                "internal error: the timeline read does not parse ({e})"
            ))
        })?;
        Ok(Some(Plan {
            statements,
            ..Default::default()
        }))
    }
}

/// The page a read asks for.
enum Page<'q> {
    /// `n + k`, the last row of the page, known when planning.
    Known(i64),
    /// `LIMIT n [OFFSET k]` with parameters (prepared statements), as written.
    Params(&'q Expr, Option<&'q Expr>),
}

/// A timeline read taken apart.
struct Shape<'q> {
    /// The message table's and the follow table's names as written, and the
    /// names they are read under.
    messages: (&'q ObjectName, String),
    follows: (&'q ObjectName, String),
    /// The message table's and the follow table's `FROM` items as written.
    factors: (&'q TableFactor, &'q TableFactor),
    /// The join condition of `JOIN … ON` (`None`: a comma join).
    join_on: Option<&'q Expr>,
    /// The messages' AUTO_INCREMENT column.
    id: String,
    /// The reader's value (`follows.reader = v`).
    reader_value: &'q Expr,
    /// The keyset bound (`messages.id < v` or `<= v`): operator and value.
    before: Option<(&'static str, &'q Expr)>,
    /// The page's `LIMIT n [OFFSET k]`.
    page: Page<'q>,
    /// `SELECT *` is written: expanded in FROM order (the derived table the
    /// rewrite adds must not show).
    star_order: Vec<String>,
}

impl<'q> Shape<'q> {
    fn of(
        rule: &TimelineRule,
        q: &'q Query,
        ctx: &PlanContext<'_>,
    ) -> Result<Option<Shape<'q>>, Refusal> {
        let Some(sel) = crate::rewrite::shape::plain_select(q) else {
            return Ok(None);
        };
        if !matches!(&sel.group_by, sqlparser::ast::GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty())
        {
            return Ok(None);
        }
        // FROM: `m JOIN f ON cond` (either order) or `m, f`.
        let mut items: Vec<&TableFactor> = Vec::new();
        let mut join_on: Option<&Expr> = None;
        match sel.from.as_slice() {
            [TableWithJoins { relation, joins }] => {
                let [j] = joins.as_slice() else {
                    return Ok(None);
                };
                let on = match &j.join_operator {
                    JoinOperator::Join(JoinConstraint::On(e))
                    | JoinOperator::Inner(JoinConstraint::On(e)) => e,
                    _ => return Ok(None),
                };
                if j.global {
                    return Ok(None);
                }
                items.extend([relation, &j.relation]);
                join_on = Some(on);
            }
            [a, b] if a.joins.is_empty() && b.joins.is_empty() => {
                items.extend([&a.relation, &b.relation]);
            }
            _ => return Ok(None),
        }
        let (Some(first), Some(second)) = (plain_table(items[0]), plain_table(items[1])) else {
            return Ok(None);
        };
        let (messages, follows, factors) =
            if rule.messages.named_by(first.0, ctx) && rule.follows.named_by(second.0, ctx) {
                (first.clone(), second.clone(), (items[0], items[1]))
            } else if rule.follows.named_by(first.0, ctx) && rule.messages.named_by(second.0, ctx) {
                (second.clone(), first.clone(), (items[1], items[0]))
            } else {
                return Ok(None);
            };
        if eq(&messages.1, &follows.1) {
            return Ok(None);
        }
        let star_order = vec![first.1.clone(), second.1.clone()];
        // The columns: `*`, `t.*` or column references of the two tables.
        for item in &sel.projection {
            let ok = match item {
                SelectItem::Wildcard(o) | SelectItem::QualifiedWildcard(_, o) => {
                    o.opt_ilike.is_none()
                        && o.opt_exclude.is_none()
                        && o.opt_except.is_none()
                        && o.opt_replace.is_none()
                        && o.opt_rename.is_none()
                }
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                    matches!(e, Expr::Identifier(_) | Expr::CompoundIdentifier(_))
                }
                _ => false,
            };
            if !ok {
                return Ok(None);
            }
        }
        let meta = rule.messages.columns(ctx)?;
        let Some(id) = id_column(&meta) else {
            return Ok(None);
        };
        let col_of = |e: &Expr, table: &str, column: &str| -> bool {
            matches!(e, Expr::CompoundIdentifier(p) if p.len() == 2
                && eq(&p[0].value, table) && eq(&p[1].value, column))
        };
        // The join condition and the WHERE conjuncts.
        let mut terms: Vec<&Expr> = Vec::new();
        if let Some(on) = join_on {
            conjuncts(on, &mut terms);
            if terms.len() != 1 {
                return Ok(None);
            }
        }
        let Some(selection) = &sel.selection else {
            return Ok(None);
        };
        conjuncts(selection, &mut terms);
        let (m, f) = (&messages.1, &follows.1);
        let mut joined = false;
        let mut reader_value = None;
        let mut before = None;
        for t in terms {
            let Expr::BinaryOp { left, op, right } = t else {
                return Ok(None);
            };
            let (l, r) = (left.as_ref(), right.as_ref());
            match op {
                BinaryOperator::Eq
                    if (col_of(l, m, &rule.author) && col_of(r, f, &rule.followed))
                        || (col_of(r, m, &rule.author) && col_of(l, f, &rule.followed)) =>
                {
                    joined = true;
                }
                BinaryOperator::Eq if col_of(l, f, &rule.reader) && ctx.slot(r).is_some() => {
                    reader_value = Some(r);
                }
                BinaryOperator::Eq if col_of(r, f, &rule.reader) && ctx.slot(l).is_some() => {
                    reader_value = Some(l);
                }
                BinaryOperator::Lt if col_of(l, m, &id) && ctx.slot(r).is_some() => {
                    before = Some(("<", r));
                }
                BinaryOperator::LtEq if col_of(l, m, &id) && ctx.slot(r).is_some() => {
                    before = Some(("<=", r));
                }
                _ => return Ok(None),
            }
        }
        let Some(reader_value) = reader_value else {
            return Ok(None);
        };
        if !joined {
            return Ok(None);
        }
        // ORDER BY m.id DESC, LIMIT n [OFFSET k] with literal numbers.
        let Some(order) = &q.order_by else {
            return Ok(None);
        };
        let OrderByKind::Expressions(exprs) = &order.kind else {
            return Ok(None);
        };
        let [o] = exprs.as_slice() else {
            return Ok(None);
        };
        let desc = matches!(o.options.sort, Some(sqlparser::ast::OrderBySort::Desc))
            && o.options.nulls_first.is_none();
        if !desc || o.with_fill.is_some() || !col_of(&o.expr, m, &id) || order.interpolate.is_some()
        {
            return Ok(None);
        }
        let number = |e: &Expr| ctx.literal(e).and_then(|l| l.as_i64());
        let (limit, offset): (&Expr, Option<&Expr>) = match &q.limit_clause {
            Some(LimitClause::LimitOffset {
                limit: Some(limit),
                offset,
                limit_by,
            }) if limit_by.is_empty() => (limit, offset.as_ref().map(|o| &o.value)),
            Some(LimitClause::OffsetCommaLimit { offset, limit }) => (limit, Some(offset)),
            _ => return Ok(None),
        };
        let page = match (number(limit), offset.map(number)) {
            (Some(limit), None | Some(Some(_))) => {
                let offset = offset.and_then(number).unwrap_or(0);
                let page_end = limit.saturating_add(offset);
                if limit < 1 || offset < 0 || page_end > MAX_PAGE_END {
                    return Ok(None);
                }
                Page::Known(page_end)
            }
            // `LIMIT ?` / `OFFSET ?` of a prepared statement: the values come with
            // each execute.
            _ if ctx.prepared
                && std::iter::once(limit).chain(offset).all(|e| {
                    number(e).is_some() || (ctx.slot(e).is_some() && ctx.literal(e).is_none())
                }) =>
            {
                Page::Params(limit, offset)
            }
            _ => return Ok(None),
        };
        Ok(Some(Shape {
            messages: (messages.0, messages.1.clone()),
            follows: (follows.0, follows.1.clone()),
            factors,
            join_on,
            id,
            reader_value,
            before,
            page,
            star_order: if sel
                .projection
                .iter()
                .any(|i| matches!(i, SelectItem::Wildcard(_)))
            {
                star_order
            } else {
                Vec::new()
            },
        }))
    }

    /// The rewritten read.
    fn sql(&self, rule: &TimelineRule, q: &Query) -> String {
        let SetExpr::Select(sel) = q.body.as_ref() else {
            return String::new();
        };
        let id = quote(&self.id);
        let before = self
            .before
            .map(|(op, v)| format!(" AND `hs_m`.{id} {op} {v}"))
            .unwrap_or_default();
        let message = quote(MAILBOX_MESSAGE);
        let (m, author) = (&self.messages.0, quote(&rule.author));
        let (f, followed, reader) = (&self.follows.0, quote(&rule.followed), quote(&rule.reader));
        let r = self.reader_value;
        let mailbox_from = |mb: &TableName| {
            format!(
                "FROM {} AS `hs_b` WHERE `hs_b`.{} = {r}{} ORDER BY `hs_b`.{message} DESC",
                rule.messages.physical_sql(mb, self.messages.0),
                quote(MAILBOX_READER),
                self.before
                    .map(|(op, v)| format!(" AND `hs_b`.{message} {op} {v}"))
                    .unwrap_or_default(),
            )
        };
        let newest = format!(
            "(SELECT `hs_m`.{id} FROM {m} AS `hs_m` WHERE `hs_m`.{author} = `hs_f`.{followed}{before} \
             ORDER BY `hs_m`.{id} DESC LIMIT 1) AS `hs_mx` FROM {f} AS `hs_f` WHERE `hs_f`.{reader} = {r} \
             ORDER BY `hs_mx` DESC"
        );
        let bound = match self.page {
            Page::Known(page_end) => {
                let last = page_end - 1;
                let mailbox = rule
                    .mailbox
                    .as_ref()
                    .map(|mb| {
                        format!(
                            "(SELECT `hs_b`.{message} {} LIMIT 1 OFFSET {last}), ",
                            mailbox_from(mb)
                        )
                    })
                    .unwrap_or_default();
                // The (n + k)-th newest of the followees' newest ids …
                let pull =
                    format!("(SELECT `hs_x`.`hs_mx` FROM (SELECT {newest} LIMIT 1 OFFSET {last}) AS `hs_x`)");
                // … or, with fewer followees than that, the largest of their (n + k)-th
                // newest.
                let deep = format!(
                    "(SELECT MAX(`hs_y`.`hs_k`) FROM (SELECT (SELECT `hs_m`.{id} FROM {m} AS `hs_m` \
                     WHERE `hs_m`.{author} = `hs_f`.{followed}{before} ORDER BY `hs_m`.{id} DESC LIMIT 1 OFFSET {last}) AS `hs_k` \
                     FROM {f} AS `hs_f` WHERE `hs_f`.{reader} = {r}) AS `hs_y`)"
                );
                format!("{mailbox}{pull}, {deep}")
            }
            // The values are not known here, and LIMIT takes no arithmetic: the
            // (n + k)-th largest is the smallest of rows k + 1 … k + n, when there
            // are n of them (NULLs, followees without messages, sort last and do not
            // count).
            Page::Params(n, k) => {
                let page = match k {
                    Some(k) => format!("LIMIT {n} OFFSET {k}"),
                    None => format!("LIMIT {n}"),
                };
                let mailbox = rule
                    .mailbox
                    .as_ref()
                    .map(|mb| {
                        format!(
                            "(SELECT MIN(`hs_z`.`hs_mx`) FROM (SELECT `hs_b`.{message} AS `hs_mx` {} {page}) AS `hs_z` \
                             HAVING COUNT(`hs_z`.`hs_mx`) = {n}), ",
                            mailbox_from(mb)
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "{mailbox}(SELECT MIN(`hs_x`.`hs_mx`) FROM (SELECT {newest} {page}) AS `hs_x` \
                     HAVING COUNT(`hs_x`.`hs_mx`) = {n})"
                )
            }
        };
        let bound = format!("(SELECT COALESCE({bound}, 0) AS `hs_t`) AS `hs_t`");
        let projection: Vec<String> = sel
            .projection
            .iter()
            .flat_map(|i| match i {
                SelectItem::Wildcard(_) => self
                    .star_order
                    .iter()
                    .map(|t| format!("{}.*", quote(t)))
                    .collect::<Vec<_>>(),
                other => vec![other.to_string()],
            })
            .collect();
        // The follows first, each followee's messages read through the (author, id)
        // index from the bound up; left to itself the optimiser may scan every
        // message above the bound instead.
        let on = self.join_on.map(|e| format!(" ON {e}")).unwrap_or_default();
        let mut sql = format!(
            "SELECT {} FROM {bound}, {} STRAIGHT_JOIN {}{on}",
            projection.join(", "),
            self.factors.1,
            self.factors.0
        );
        if let Some(w) = &sel.selection {
            sql.push_str(&format!(
                " WHERE ({w}) AND {}.{id} >= `hs_t`.`hs_t`",
                quote(&self.messages.1)
            ));
        }
        if let Some(o) = &q.order_by {
            sql.push_str(&format!(" {o}"));
        }
        if let Some(l) = &q.limit_clause {
            sql.push_str(&format!(" {l}"));
        }
        sql
    }
}

/// The AUTO_INCREMENT column of the message table.
fn id_column(meta: &[ColumnDef]) -> Option<String> {
    meta.iter()
        .find(|d| d.flags & AUTO_INCREMENT_FLAG != 0)
        .map(|d| String::from_utf8_lossy(&d.org_name).into_owned())
}

impl Rule for TimelineRule {
    fn physical_tables(&self) -> Vec<(String, String)> {
        self.mailbox
            .iter()
            .map(|m| (m.name.clone(), self.messages.name().name.to_string()))
            .collect()
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn tables(&self) -> &[TableName] {
        &self.tables
    }

    fn shadow(&self) -> bool {
        self.shadow
    }

    /// Writes pass through: the mailbox's triggers keep it.
    fn plans_updates(&self) -> bool {
        false
    }

    /// The messages and follows hold the data and the triggers keep the mailbox,
    /// whatever the statement.
    fn runs_unread(&self) -> bool {
        true
    }

    fn metadata_query(&self, current_db: Option<&str>) -> Option<String> {
        self.messages.metadata_query(current_db)
    }

    fn provide_metadata(&self, current_db: Option<&str>, columns: &[ColumnDef]) {
        self.messages.provide_metadata(current_db, columns);
    }

    fn plan(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, Refusal> {
        match stmt {
            Statement::Query(q) => self.plan_read(q, ctx),
            Statement::Truncate(_) if self.mailbox.is_some() => Err(Refusal::ddl(format!(
                "TRUNCATE fires no trigger, so timeline rule {} ({}) would keep mailbox entries of the removed rows; use DELETE, or empty {} first on the database directly",
                self.name,
                self.mode.name(),
                self.mailbox.as_ref().map(TableName::quoted).unwrap_or_default()
            ))),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::spec::TimelineSpec;
    use super::TimelineRule;
    use crate::rewrite::testutil::{
        assert_fallbacks, assert_passthrough, assert_sql, col, rewrite,
    };
    use crate::rewrite::Engine;
    use crate::wire::resultset::types;

    fn engine() -> Engine {
        engine_in("mode = \"pull\"")
    }

    fn engine_in(mode: &str) -> Engine {
        let specs: Vec<TimelineSpec> = crate::kinds::entries(
            &format!("[[timeline]]\nname = \"friends\"\nmessages = \"message\"\nmessage_author = \"user_id\"\n\
             follows = \"follower\"\nfollow_reader = \"user_id\"\nfollow_author = \"follower_id\"\n{mode}\n"),
            "timeline",
        )
        .unwrap();
        let e = Engine::new(vec![Arc::new(TimelineRule::new(&specs[0]).unwrap())], 100).unwrap();
        e.provide_metadata(
            0,
            Some("shop"),
            &[
                col("message", "id", types::LONG, 0x4223),
                col("message", "user_id", types::LONG, 0x4029),
                col("message", "body", 0xfd, 0x1001),
            ],
        );
        e
    }

    fn bound(author_ref: &str, reader: &str, before: &str, offset: i64) -> String {
        format!(
            "(SELECT COALESCE((SELECT `hs_x`.`hs_mx` FROM (SELECT (SELECT `hs_m`.`id` FROM {author_ref} AS `hs_m` \
             WHERE `hs_m`.`user_id` = `hs_f`.`follower_id`{before} ORDER BY `hs_m`.`id` DESC LIMIT 1) AS `hs_mx` FROM follower AS `hs_f` \
             WHERE `hs_f`.`user_id` = {reader} ORDER BY `hs_mx` DESC LIMIT 1 OFFSET {offset}) AS `hs_x`), \
             (SELECT MAX(`hs_y`.`hs_k`) FROM (SELECT (SELECT `hs_m`.`id` FROM {author_ref} AS `hs_m` \
             WHERE `hs_m`.`user_id` = `hs_f`.`follower_id`{before} ORDER BY `hs_m`.`id` DESC LIMIT 1 OFFSET {offset}) AS `hs_k` \
             FROM follower AS `hs_f` WHERE `hs_f`.`user_id` = {reader}) AS `hs_y`), 0) AS `hs_t`) AS `hs_t`"
        )
    }

    #[test]
    fn join_on_reads_each_followees_newest() {
        let e = engine();
        let r = rewrite(
            &e,
            "SELECT message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id \
             WHERE follower.user_id = 42 ORDER BY message.id DESC LIMIT 20",
        );
        assert_sql(
            &r,
            &[&format!(
                "SELECT message.* FROM {}, follower STRAIGHT_JOIN message ON message.user_id = follower.follower_id \
                 WHERE (follower.user_id = 42) AND `message`.`id` >= `hs_t`.`hs_t` ORDER BY message.id DESC LIMIT 20",
                bound("message", "42", "", 19)
            )],
        );
    }

    #[test]
    fn comma_join_star_keyset_and_offset() {
        let e = engine();
        let r = rewrite(
            &e,
            "SELECT * FROM message m, follower f WHERE f.user_id = 7 AND m.user_id = f.follower_id \
             AND m.id < 1000 ORDER BY m.id DESC LIMIT 10 OFFSET 5",
        );
        assert_sql(
            &r,
            &[&format!(
                "SELECT `m`.*, `f`.* FROM {}, follower f STRAIGHT_JOIN message m \
                 WHERE (f.user_id = 7 AND m.user_id = f.follower_id AND m.id < 1000) AND `m`.`id` >= `hs_t`.`hs_t` \
                 ORDER BY m.id DESC LIMIT 10 OFFSET 5",
                bound("message", "7", " AND `hs_m`.`id` < 1000", 14)
            )],
        );
    }

    #[test]
    fn push_and_hybrid_take_the_bound_from_the_mailbox_first() {
        for mode in ["push", "hybrid"] {
            let e = engine_in(&format!("mode = \"{mode}\"\nmailbox = \"inbox\""));
            let r = rewrite(
                &e,
                "SELECT m.* FROM shop.message m JOIN follower f ON m.user_id = f.follower_id \
                 WHERE f.user_id = 9 AND m.id < 500 ORDER BY m.id DESC LIMIT 20",
            );
            let pull = bound("shop.message", "9", " AND `hs_m`.`id` < 500", 19);
            let mailbox = "(SELECT `hs_b`.`hs_message` FROM shop.`inbox` AS `hs_b` WHERE `hs_b`.`hs_reader` = 9 \
                 AND `hs_b`.`hs_message` < 500 ORDER BY `hs_b`.`hs_message` DESC LIMIT 1 OFFSET 19), ";
            let both = pull.replacen("COALESCE(", &format!("COALESCE({mailbox}"), 1);
            assert_sql(
                &r,
                &[&format!(
                    "SELECT m.* FROM {both}, follower f STRAIGHT_JOIN shop.message m ON m.user_id = f.follower_id \
                     WHERE (f.user_id = 9 AND m.id < 500) AND `m`.`id` >= `hs_t`.`hs_t` ORDER BY m.id DESC LIMIT 20"
                )],
            );
            let err = crate::rewrite::testutil::reject(&e, "TRUNCATE TABLE follower");
            assert!(err.contains("fires no trigger"), "{err}");
        }
    }

    #[test]
    fn prepared_limit_and_offset_parameters() {
        let e = engine_in("mode = \"push\"\nmailbox = \"inbox\"");
        let d = crate::rewrite::testutil::decide_prepared(
            &e,
            "SELECT m.* FROM message m JOIN follower f ON m.user_id = f.follower_id \
              WHERE f.user_id = ? ORDER BY m.id DESC LIMIT ? OFFSET ?",
        );
        let crate::rewrite::Decision::Rewrite(r) = d else {
            panic!("expected a rewrite, got {d:?}");
        };
        // The (n + k)-th largest as the smallest of rows k + 1 … k + n, when there
        // are n of them; no arithmetic on the parameters.
        let newest = "(SELECT `hs_m`.`id` FROM message AS `hs_m` WHERE `hs_m`.`user_id` = `hs_f`.`follower_id` \
             ORDER BY `hs_m`.`id` DESC LIMIT 1) AS `hs_mx` FROM follower AS `hs_f` WHERE `hs_f`.`user_id` = ? \
             ORDER BY `hs_mx` DESC";
        assert_sql(
            &r,
            &[&format!(
                "SELECT m.* FROM (SELECT COALESCE(\
                 (SELECT MIN(`hs_z`.`hs_mx`) FROM (SELECT `hs_b`.`hs_message` AS `hs_mx` FROM `inbox` AS `hs_b` \
                 WHERE `hs_b`.`hs_reader` = ? ORDER BY `hs_b`.`hs_message` DESC LIMIT ? OFFSET ?) AS `hs_z` \
                 HAVING COUNT(`hs_z`.`hs_mx`) = ?), \
                 (SELECT MIN(`hs_x`.`hs_mx`) FROM (SELECT {newest} LIMIT ? OFFSET ?) AS `hs_x` \
                 HAVING COUNT(`hs_x`.`hs_mx`) = ?), 0) AS `hs_t`) AS `hs_t`, \
                 follower f STRAIGHT_JOIN message m ON m.user_id = f.follower_id \
                 WHERE (f.user_id = ?) AND `m`.`id` >= `hs_t`.`hs_t` ORDER BY m.id DESC LIMIT ? OFFSET ?"
            )],
        );
    }

    #[test]
    fn other_shapes_fall_back_or_pass() {
        let e = engine();
        let fallbacks = [
            // Another predicate on the messages, another order, no limit, an aggregate.
            "SELECT m.* FROM message m JOIN follower f ON m.user_id = f.follower_id WHERE f.user_id = 1 AND m.body <> '' ORDER BY m.id DESC LIMIT 20",
            "SELECT m.* FROM message m JOIN follower f ON m.user_id = f.follower_id WHERE f.user_id = 1 ORDER BY m.id LIMIT 20",
            "SELECT m.* FROM message m JOIN follower f ON m.user_id = f.follower_id WHERE f.user_id = 1 ORDER BY m.id DESC",
            "SELECT COUNT(*) FROM message m JOIN follower f ON m.user_id = f.follower_id WHERE f.user_id = 1",
            "SELECT m.* FROM message m LEFT JOIN follower f ON m.user_id = f.follower_id WHERE f.user_id = 1 ORDER BY m.id DESC LIMIT 20",
        ];
        assert_fallbacks(&e, &fallbacks);
        let passed = [
            "SELECT * FROM message WHERE id = 1",
            "INSERT INTO message (user_id, body) VALUES (1, 'x')",
            "DELETE FROM follower WHERE user_id = 1",
            "UPDATE IGNORE follower SET follower_id = 2 WHERE user_id = 1",
            "DELETE LOW_PRIORITY FROM message WHERE id = 3",
        ];
        assert_passthrough(&e, &passed);
    }
}
