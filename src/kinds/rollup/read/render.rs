//! Rendering the rewrite: the SQL that answers a recognised read from the
//! rollup's whole buckets and the log's ragged edges (the one-step form), and the
//! two-step form with a prelude computing the bounds.

use std::sync::Arc;

use sqlparser::ast::Expr;

use super::{Bound, Filter, Group, Item, Shape};
use crate::kinds::rollup::rule::{RollupRule, Tier};
use crate::kinds::rollup::spec::{Bucket, Measure};
use crate::rewrite::shape::eq;
use crate::rewrite::{PlanContext, TableName};
use crate::rules::spec::quote;
use crate::wire::resultset::ColumnDef;

/// Bit of `hs_nulls` set when the time column is NULL.
const TIME_NULL_BIT: u64 = 1 << 31;

impl<'q> Shape<'q> {
    /// The statement that answers the read.
    pub(super) fn sql(&self, rule: &RollupRule) -> String {
        let group: Vec<Group> = self.group.clone().unwrap_or_default();
        let inner = self.inner_sql(rule, &group, &self.measured());
        self.outer_sql(rule, &inner)
    }

    /// The statement around the grouping query `inner`: the output columns as
    /// the client named them, in the order MariaDB would return them.
    fn outer_sql(&self, rule: &RollupRule, inner: &str) -> String {
        let a = quote(&self.alias);
        let group: Vec<Group> = self.group.clone().unwrap_or_default();
        let dim = |d: usize| quote(&rule.logical.key()[d]);
        let outer_items: Vec<String> = self
            .items
            .iter()
            .map(|i| match i {
                Item::Dim { dim: d, name } => format!("{a}.{} AS {}", dim(*d), quote(name)),
                Item::Agg {
                    alias,
                    name: Some(name),
                    ..
                } => format!("{a}.{} AS {}", quote(alias), quote(name)),
                Item::Agg { alias, .. } => format!("{a}.{}", quote(alias)),
                Item::Time { format, alias } => format!(
                    "{} AS {}",
                    time_sql(&format!("{a}.`hs_t`"), *format),
                    quote(alias)
                ),
            })
            .collect();
        let order = if !self.order_by.is_empty() {
            format!(" {}", self.order_by)
        } else if !group.is_empty() {
            // MariaDB returns groups sorted by the GROUP BY columns.
            let cols: Vec<String> = group
                .iter()
                .map(|g| match g {
                    Group::Dim(d) => format!("{a}.{}", dim(*d)),
                    Group::Time => quote(&self.time_alias().unwrap_or_default()),
                })
                .collect();
            format!(" ORDER BY {}", cols.join(", "))
        } else {
            String::new()
        };
        let limit = if self.limit.is_empty() {
            String::new()
        } else {
            format!(" {}", self.limit)
        };
        format!(
            "SELECT {} FROM ({inner}) AS {a}{order}{limit}",
            outer_items.join(", ")
        )
    }

    /// The measured columns the read needs: (column, with its sum), each once;
    /// a `COUNT(col)` needs the column's count, a `SUM(col)` its count and sum.
    fn measured(&self) -> Vec<(&str, bool)> {
        let mut out: Vec<(&str, bool)> = Vec::new();
        for i in &self.items {
            let (c, sum) = match i {
                Item::Agg {
                    measure: Measure::Count(c),
                    ..
                } => (c.as_str(), false),
                Item::Agg {
                    measure: Measure::Sum(c),
                    ..
                } => (c.as_str(), true),
                _ => continue,
            };
            match out.iter_mut().find(|(o, _)| eq(o, c)) {
                Some(entry) => entry.1 |= sum,
                None => out.push((c, sum)),
            }
        }
        out
    }

    /// The time series item's format (`None` for `DATE`), if the read has one.
    fn time_format(&self) -> Option<Option<&'q Expr>> {
        self.items.iter().find_map(|i| match i {
            Item::Time { format, .. } => Some(*format),
            _ => None,
        })
    }

    /// What a part of the union hands over for the time series of the time `t`:
    /// `DATE(t)` for a `DATE` series, `CAST(t AS BINARY)` (the time's text) for a
    /// `DATE_FORMAT` one. Not the DATETIME itself: under NO_ZERO_IN_DATE or
    /// NO_ZERO_DATE the union's temporary table and `MIN` read a zero or zero-in-date
    /// time (`2024-05-00`) as NULL or the zero date, which the log's read groups and
    /// labels as it is. A date is NULL where the session's mode makes it so and
    /// valid under it otherwise, so it passes both unchanged; `DATE_FORMAT` formats
    /// the text as it formats the DATETIME, with no warning in any mode (a `DATE()`
    /// of the text would warn on a zero date).
    fn time_value(&self, t: &str) -> String {
        match self.time_format().flatten() {
            None => format!("DATE({t})"),
            Some(_) => format!("CAST({t} AS BINARY)"),
        }
    }

    /// The grouping query over the rollup's and the log's rows.
    fn inner_sql(&self, rule: &RollupRule, group: &[Group], measured: &[(&str, bool)]) -> String {
        let own = Source {
            table: &rule.rollup_table,
            dims: rule.logical.key(),
        };
        let bucket = format!("{}.`hs_bucket`", quote(&self.alias));
        let range = self.within(&bucket, rule.bucket);
        let mut parts = vec![self.bucket_part(rule, &own, group, measured, &range, None)];
        if self.lower.is_some() || self.upper.is_some() {
            // The edges: whole finer buckets from a finer rollup when one can answer,
            // the rest from the log.
            let mut edge = rule.bucket;
            if let Some(tier) = self.tier(rule, group, measured) {
                let fine = Source {
                    table: &tier.table,
                    dims: &tier.dims,
                };
                let mut range = self.within(&bucket, tier.bucket);
                range.push(outside(
                    &bucket,
                    self.start(rule.bucket),
                    self.end(rule.bucket),
                ));
                parts.push(self.bucket_part(rule, &fine, group, measured, &range, None));
                edge = tier.bucket;
            }
            let a = quote(&self.alias);
            let t = format!("{a}.{}", quote(&rule.time));
            let edges = self.log_edges(&t, edge);
            let selection = self
                .selection
                .map_or_else(String::new, |w| format!("({w}) AND "));
            parts.push(self.log_part(rule, group, measured, &format!("{selection}{edges}"), None));
        }
        self.grouping_sql(rule, group, &parts)
    }

    /// The query grouping the rows of `parts` (a `UNION ALL` of rollup and log
    /// rows) by the read's groups.
    fn grouping_sql(&self, rule: &RollupRule, group: &[Group], parts: &[String]) -> String {
        let dim = |d: usize| quote(&rule.logical.key()[d]);
        let mut select: Vec<String> = Vec::new();
        let mut by: Vec<String> = Vec::new();
        for g in group {
            match g {
                Group::Dim(d) => {
                    select.push(format!("`hs_u`.{}", dim(*d)));
                    by.push(format!("`hs_u`.{}", dim(*d)));
                }
                Group::Time => {
                    // Any value of the group (the parts hand over a date or the
                    // time's text, see `time_value`): the outer query applies the
                    // function again.
                    select.push("MIN(`hs_u`.`hs_t`) AS `hs_t`".to_string());
                    by.push(time_sql("`hs_u`.`hs_t`", self.time_format().flatten()));
                }
            }
        }
        for i in &self.items {
            let Item::Agg { measure, alias, .. } = i else {
                continue;
            };
            let count = |column: &str| {
                format!("CAST(COALESCE(SUM(`hs_u`.{}), 0) AS SIGNED)", quote(column))
            };
            let value = match measure {
                Measure::Rows => count("hs_rows"),
                Measure::Count(c) => count(&format!("hs_count_{c}")),
                // NULL when the group has no value, as SUM over the log.
                Measure::Sum(c) => format!(
                    "IF(SUM(`hs_u`.{}) = 0, NULL, SUM(`hs_u`.{}))",
                    quote(&format!("hs_count_{c}")),
                    quote(&format!("hs_sum_{c}"))
                ),
            };
            select.push(format!("{value} AS {}", quote(alias)));
        }
        let mut sql = format!(
            "SELECT {} FROM ({}) AS `hs_u`",
            select.join(", "),
            parts.join(" UNION ALL ")
        );
        if !by.is_empty() {
            sql.push_str(&format!(
                " GROUP BY {} HAVING SUM(`hs_u`.`hs_rows`) > 0",
                by.join(", ")
            ));
        }
        sql
    }

    /// Whole buckets from a rollup table (the rule's own or a finer one's):
    /// `range` are the conditions on its `hs_bucket`.
    fn bucket_part(
        &self,
        rule: &RollupRule,
        src: &Source<'_>,
        group: &[Group],
        measured: &[(&str, bool)],
        range: &[String],
        sign: Option<&str>,
    ) -> String {
        let signed = |v: String| match sign {
            Some(s) => format!("({s}) * {v}"),
            None => v,
        };
        let a = quote(&self.alias);
        let bit = |d: usize| 1u64 << src.bit(&rule.logical.key()[d]);
        let mut cols: Vec<String> = group
            .iter()
            .map(|g| match g {
                Group::Dim(d) => {
                    let name = quote(&rule.logical.key()[*d]);
                    format!(
                        "IF(({a}.`hs_nulls` & {}) <> 0, NULL, {a}.{name}) AS {name}",
                        bit(*d)
                    )
                }
                Group::Time => format!(
                    "{} AS `hs_t`",
                    self.time_value(&format!(
                        "IF(({a}.`hs_nulls` & {TIME_NULL_BIT}) <> 0, NULL, {a}.`hs_bucket`)"
                    ))
                ),
            })
            .collect();
        cols.push(format!("{} AS `hs_rows`", signed(format!("{a}.`hs_rows`"))));
        for (c, sum) in measured {
            let name = quote(&format!("hs_count_{c}"));
            cols.push(format!("{} AS {name}", signed(format!("{a}.{name}"))));
            if *sum {
                let name = quote(&format!("hs_sum_{c}"));
                cols.push(format!("{} AS {name}", signed(format!("{a}.{name}"))));
            }
        }
        let mut conds: Vec<String> = Vec::new();
        for f in &self.filters {
            let (dim, null) = match f {
                Filter::Value { dim, expr, .. } => {
                    conds.push(expr.to_string());
                    (*dim, false)
                }
                Filter::IsNull(dim) => (*dim, true),
                Filter::NotNull(dim) => (*dim, false),
            };
            let op = if null { "<>" } else { "=" };
            conds.push(format!("({a}.`hs_nulls` & {}) {op} 0", bit(dim)));
        }
        conds.extend(range.iter().cloned());
        if self.lower.is_some() || self.upper.is_some() {
            conds.push(format!("({a}.`hs_nulls` & {TIME_NULL_BIT}) = 0"));
        }
        let table = rule.logical.physical_sql(src.table, self.table);
        let mut sql = format!("SELECT {} FROM {table} AS {a}", cols.join(", "));
        if !conds.is_empty() {
            sql.push_str(&format!(" WHERE {}", conds.join(" AND ")));
        }
        sql
    }

    /// The ragged edges, from the log.
    /// `cond`: its WHERE clause; `sign`: a signed read's weight of each row and
    /// the scale of each summed column (its sums are then DECIMAL, so that an
    /// unsigned column can be subtracted).
    fn log_part(
        &self,
        rule: &RollupRule,
        group: &[Group],
        measured: &[(&str, bool)],
        cond: &str,
        sign: Option<(&str, &[ColumnDef])>,
    ) -> String {
        let a = quote(&self.alias);
        let t = format!("{a}.{}", quote(&rule.time));
        let mut cols: Vec<String> = group
            .iter()
            .map(|g| match g {
                Group::Dim(d) => {
                    let name = quote(&rule.logical.key()[*d]);
                    format!("{a}.{name} AS {name}")
                }
                Group::Time => format!("{} AS `hs_t`", self.time_value(&t)),
            })
            .collect();
        let weight = sign.map(|(s, _)| format!("({s})"));
        cols.push(format!("{} AS `hs_rows`", weight.as_deref().unwrap_or("1")));
        for (c, sum) in measured {
            let present = format!("({a}.{} IS NOT NULL)", quote(c));
            let count = match &weight {
                Some(w) => format!("{w} * {present}"),
                None => present,
            };
            cols.push(format!("{count} AS {}", quote(&format!("hs_count_{c}"))));
            if *sum {
                let value = match sign {
                    Some((s, meta)) => {
                        let scale = meta
                            .iter()
                            .find(|d| eq(&String::from_utf8_lossy(&d.org_name), c))
                            .map_or(0, |d| d.decimals);
                        format!("({s}) * CAST({a}.{} AS DECIMAL(65,{scale}))", quote(c))
                    }
                    None => format!("{a}.{}", quote(c)),
                };
                cols.push(format!("{value} AS {}", quote(&format!("hs_sum_{c}"))));
            }
        }
        format!(
            "SELECT {} FROM {} AS {a} WHERE {cond}",
            cols.join(", "),
            self.table
        )
    }

    /// The two-step form of a read with a time range (see [`Prelude`]): the query
    /// computing its bounds, and the read with those values as literals. `None` for
    /// a TIMESTAMP log (its UTC buckets are compared through the session's time
    /// zone) and for a read without a time range.
    ///
    /// With literal bounds the parts are signed instead of cut at the range's
    /// edges. For any `Dl` on the rollup's bucket grid, `Hl` on the finer one's and
    /// the range's lower bound `L`:
    ///
    /// `[t ≥ L] = [t ≥ Dl] + ([t ≥ Hl] − [t ≥ Dl]) + ([t ≥ L] − [t ≥ Hl])`
    ///
    /// and the same at the upper bound, so a row of the range is counted once
    /// whichever boundaries are picked: by the rollup between the two `D`s, plus or
    /// minus by the finer rollup between `Hl` and `Dl`, plus or minus by the log
    /// between `L` and `Hl`. The prelude picks each boundary nearest to its bound
    /// (the next one for an upper bound at or after `NOW()`, where the log has
    /// nothing yet), so the log is read for at most half a finer bucket at each
    /// edge (most often nothing after `NOW()`), where the one-step form reads
    /// a whole one. Two equal boundaries cancel whatever their value; where a level
    /// has no whole bucket between them, both are set to `L` so that nothing is read
    /// twice.
    pub(super) fn prelude_sql(
        &self,
        rule: &RollupRule,
        meta: &[ColumnDef],
        ctx: &PlanContext<'_>,
    ) -> Option<(String, Arc<crate::kinds::rollup::bounds::Bounds>, String)> {
        if self.utc || (self.lower.is_none() && self.upper.is_none()) {
            return None;
        }
        let group: Vec<Group> = self.group.clone().unwrap_or_default();
        let measured = self.measured();
        let tier = self.tier(rule, &group, &measured);
        // Coarsest first.
        let mut levels = vec![rule.bucket];
        levels.extend(tier.map(|t| t.bucket));
        // The literals, in the order `Bounds` gives them: the bounds, then each
        // level's boundaries.
        let mut next = 0u16;
        let mut mark = || {
            let m = ctx.computed(next).to_string();
            next += 1;
            m
        };
        let lv = self.lower.as_ref().map(|_| mark());
        let uv = self.upper.as_ref().map(|_| mark());
        let bounds: Vec<(Option<String>, Option<String>)> = levels
            .iter()
            .map(|_| (lv.as_ref().map(|_| mark()), uv.as_ref().map(|_| mark())))
            .collect();
        let dt = |b: &Bound<'_>| format!("CAST(({}) AS DATETIME(6))", b.expr);
        let mut cols: Vec<String> = [&self.lower, &self.upper]
            .into_iter()
            .flatten()
            .map(dt)
            .collect();
        if self.upper.is_some() {
            cols.push("NOW()".to_string());
        }
        let query = format!("SELECT {}", cols.join(", "));
        let values = Arc::new(crate::kinds::rollup::bounds::Bounds {
            lower: self.lower.is_some(),
            upper: self.upper.is_some(),
            levels: levels.clone(),
        });

        let a = quote(&self.alias);
        let bucket = format!("{a}.`hs_bucket`");
        let t = format!("{a}.{}", quote(&rule.time));
        let mut parts = Vec::new();
        let (lower_strict, upper_strict) = (
            self.lower.as_ref().is_some_and(|b| b.strict),
            self.upper.as_ref().is_some_and(|b| b.strict),
        );
        // The rollup's own buckets: between the coarsest boundaries.
        let (dl, du) = bounds.first()?;
        let (range, sign) = match (dl, du) {
            (Some(l), Some(u)) => (
                format!("(({bucket} >= {l} AND {bucket} < {u}) OR ({bucket} >= {u} AND {bucket} < {l}))"),
                Some(format!("({bucket} >= {l}) - ({bucket} >= {u})")),
            ),
            (Some(l), None) => (format!("{bucket} >= {l}"), None),
            (None, Some(u)) => (format!("{bucket} < {u}"), None),
            (None, None) => return None,
        };
        let own = Source {
            table: &rule.rollup_table,
            dims: rule.logical.key(),
        };
        parts.push(self.bucket_part(rule, &own, &group, &measured, &[range], sign.as_deref()));
        // The rows between a level's boundaries `c` and the finer level's (or the
        // bounds) `f`, and their weight; `fine_strict`: the finer lower one counts
        // from `> f`, the finer upper one up to `< f` (a bound's strictness;
        // boundaries are (false, true)).
        let between = |col: &str,
                       (cl, cu): (&Option<String>, &Option<String>),
                       (fl, fu): (&Option<String>, &Option<String>),
                       fine_strict: (bool, bool)|
         -> (String, String) {
            let mut conds = Vec::new();
            let mut terms = Vec::new();
            if let (Some(c), Some(f)) = (cl, fl) {
                // [t ≥ f] − [t ≥ c] (or [t > f] at a strict lower bound).
                let (ge, lt) = if fine_strict.0 {
                    (">", "<=")
                } else {
                    (">=", "<")
                };
                conds.push(format!("({col} {ge} {f} AND {col} < {c})"));
                conds.push(format!("({col} >= {c} AND {col} {lt} {f})"));
                terms.push(format!("({col} {ge} {f}) - ({col} >= {c})"));
            }
            if let (Some(c), Some(f)) = (cu, fu) {
                // [t ≥ c] − [t > f] (or [t ≥ f] at a strict upper bound).
                let (gt, le) = if fine_strict.1 {
                    (">=", "<")
                } else {
                    (">", "<=")
                };
                conds.push(format!("({col} >= {c} AND {col} {le} {f})"));
                conds.push(format!("({col} {gt} {f} AND {col} < {c})"));
                terms.push(format!("({col} >= {c}) - ({col} {gt} {f})"));
            }
            (format!("({})", conds.join(" OR ")), terms.join(" + "))
        };
        if let (Some(tier), [c, f]) = (tier, bounds.as_slice()) {
            let fine = Source {
                table: &tier.table,
                dims: &tier.dims,
            };
            // Boundaries, not bounds: [t ≥ Hl] below, [t ≥ Hu] above.
            let (range, sign) = between(&bucket, (&c.0, &c.1), (&f.0, &f.1), (false, true));
            parts.push(self.bucket_part(rule, &fine, &group, &measured, &[range], Some(&sign)));
        }
        let finest = bounds.last()?;
        let (range, sign) = between(
            &t,
            (&finest.0, &finest.1),
            (&lv, &uv),
            (lower_strict, upper_strict),
        );
        let mut conds: Vec<String> = self
            .filters
            .iter()
            .map(|f| match f {
                Filter::Value { expr, .. } => expr.to_string(),
                Filter::IsNull(d) => format!("{a}.{} IS NULL", quote(&rule.logical.key()[*d])),
                Filter::NotNull(d) => format!("{a}.{} IS NOT NULL", quote(&rule.logical.key()[*d])),
            })
            .collect();
        conds.push(range);
        parts.push(self.log_part(
            rule,
            &group,
            &measured,
            &conds.join(" AND "),
            Some((&sign, meta)),
        ));
        let then = self.outer_sql(rule, &self.grouping_sql(rule, &group, &parts));
        Some((query, values, then))
    }

    /// The first bucket start inside the range's lower bound, as SQL.
    fn start(&self, bucket: Bucket) -> Option<String> {
        if self.utc {
            return Some(utc_bucket(&self.lower_secs(bucket)?));
        }
        let b = self.lower.as_ref()?;
        let floor = floor(bucket, b.expr);
        let next = format!("{floor} + INTERVAL 1 {}", bucket.unit());
        Some(if b.strict {
            format!("({next})")
        } else {
            format!("IF({floor} = ({}), {floor}, {next})", b.expr)
        })
    }

    /// The start of the bucket holding the range's upper bound, as SQL: buckets
    /// before it end at or before the bound.
    fn end(&self, bucket: Bucket) -> Option<String> {
        if self.utc {
            return Some(utc_bucket(&self.upper_secs(bucket)?));
        }
        Some(floor(bucket, self.upper.as_ref()?.expr))
    }

    /// For a TIMESTAMP log: the first UTC bucket start inside the lower bound, in
    /// seconds since the epoch (`UNIX_TIMESTAMP` converts the bound from the
    /// session's time zone as the comparison with the column does; NULL when it
    /// cannot).
    fn lower_secs(&self, bucket: Bucket) -> Option<String> {
        let b = self.lower.as_ref()?;
        let w = bucket.seconds();
        Some(if b.strict {
            format!("(FLOOR(UNIX_TIMESTAMP({}) / {w}) * {w} + {w})", b.expr)
        } else {
            format!("(CEILING(UNIX_TIMESTAMP({}) / {w}) * {w})", b.expr)
        })
    }

    /// For a TIMESTAMP log: the start of the UTC bucket holding the upper bound, in
    /// seconds since the epoch (NULL when the bound cannot be converted).
    fn upper_secs(&self, bucket: Bucket) -> Option<String> {
        let b = self.upper.as_ref()?;
        let w = bucket.seconds();
        Some(format!("(FLOOR(UNIX_TIMESTAMP({}) / {w}) * {w})", b.expr))
    }

    /// The log rows of the range outside the buckets `[start, end)` of width
    /// `edge` the rollups answer. A bound the server cannot turn into a bucket
    /// (NULL) leaves every row of the range to the log, as the rollups then answer
    /// none.
    fn log_edges(&self, t: &str, edge: Bucket) -> String {
        if !self.utc {
            let before = self
                .start(edge)
                .map(|s| format!("({t} < {s} OR {s} IS NULL)"));
            let after = self
                .end(edge)
                .map(|e| format!("({t} >= {e} OR {e} IS NULL)"));
            return either(before, after);
        }
        // A TIMESTAMP compared with a DATETIME is converted in the session's time
        // zone, which is ambiguous in the hour a clock goes back: the exact test is
        // on UNIX_TIMESTAMP, behind a range on the column widened by two hours so
        // that the log's index still narrows the read.
        let u = format!("UNIX_TIMESTAMP({t})");
        let before = self.lower_secs(edge).map(|s| {
            let s = format!("IFNULL({s}, {MAX_SECS})");
            format!("({t} <= FROM_UNIXTIME(LEAST({s} + 7200, 2147483647)) AND {u} < {s})")
        });
        let after = self.upper_secs(edge).map(|e| {
            let e = format!("IFNULL({e}, -1)");
            // The zero TIMESTAMP is in the rollup's first bucket, unless the upper
            // bound could not be converted.
            format!(
                "(({e} <= 7200 OR {t} >= FROM_UNIXTIME({e} - 7200)) AND IF({u} = 0, {e} < 0, {u} >= {e}))"
            )
        });
        either(before, after)
    }

    /// Conditions keeping the `bucket` column (qualified) to the whole buckets of
    /// width `width` inside the range.
    fn within(&self, bucket: &str, width: Bucket) -> Vec<String> {
        let mut range = Vec::new();
        if let Some(s) = self.start(width) {
            range.push(format!("{bucket} >= {s}"));
        }
        if let Some(e) = self.end(width) {
            range.push(format!("{bucket} < {e}"));
        }
        range
    }

    /// The finer rollup the edges of the range are read from: the one with the
    /// fewest dimensions that has every dimension the read filters or groups by and
    /// every measure it needs.
    fn tier<'r>(
        &self,
        rule: &'r RollupRule,
        group: &[Group],
        measured: &[(&str, bool)],
    ) -> Option<&'r Tier> {
        let mut dims: Vec<usize> = group
            .iter()
            .filter_map(|g| match g {
                Group::Dim(d) => Some(*d),
                Group::Time => None,
            })
            .collect();
        dims.extend(self.filters.iter().map(|f| match f {
            Filter::Value { dim, .. } | Filter::IsNull(dim) | Filter::NotNull(dim) => *dim,
        }));
        rule.finer
            .get()?
            .iter()
            .filter(|t| {
                dims.iter()
                    .all(|&d| t.dim(&rule.logical.key()[d]).is_some())
                    && measured.iter().all(|(c, sum)| t.measures(c, *sum))
            })
            .min_by_key(|t| (t.dims.len(), std::cmp::Reverse(t.bucket)))
    }
}

/// `CAST(DATE_FORMAT(e, '<bucket start>') AS DATETIME)`: the start of the bucket
/// holding `e`.
fn floor(bucket: Bucket, e: &Expr) -> String {
    format!(
        "CAST(DATE_FORMAT(({e}), '{}') AS DATETIME)",
        bucket.format()
    )
}

/// Seconds since the epoch of `9999-12-31 23:59:59` (after every TIMESTAMP).
const MAX_SECS: u64 = 253_402_300_799;

/// `'1970-01-01' + secs`: a UTC bucket start as the rollup stores it.
fn utc_bucket(secs: &str) -> String {
    format!("('1970-01-01 00:00:00' + INTERVAL {secs} SECOND)")
}

/// `t` outside `[start, end)` (either bound may be missing: then the other side
/// only).
fn outside(t: &str, start: Option<String>, end: Option<String>) -> String {
    either(
        start.map(|s| format!("{t} < {s}")),
        end.map(|e| format!("{t} >= {e}")),
    )
}

/// `a OR b` of the conditions present (`TRUE` when none is).
fn either(a: Option<String>, b: Option<String>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("({a} OR {b})"),
        (Some(a), None) => a,
        (None, Some(b)) => b,
        (None, None) => "TRUE".to_string(),
    }
}

/// A rollup table whole buckets are read from.
struct Source<'r> {
    /// The table as its rule names it.
    table: &'r TableName,
    /// Its dimensions in its order.
    dims: &'r [String],
}

impl Source<'_> {
    /// The `hs_nulls` bit of dimension `name` (one of the table's).
    fn bit(&self, name: &str) -> usize {
        self.dims
            .iter()
            .position(|d| d.eq_ignore_ascii_case(name))
            .unwrap_or(0)
    }
}

/// `DATE(t)`, or `DATE_FORMAT(t, fmt)` with the statement's format.
fn time_sql(t: &str, format: Option<&Expr>) -> String {
    match format {
        None => format!("DATE({t})"),
        Some(f) => format!("DATE_FORMAT({t}, {f})"),
    }
}
