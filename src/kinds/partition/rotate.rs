//! The `rotate` job (`heatsink maintain --job rotate`): keeps a partition for each
//! period (hour, day or month) up to `premake` periods after the current one, a
//! catch-all `MAXVALUE` partition at the end (so an insert beyond the last period
//! never fails with 1526), and drops the partitions wholly older than
//! `retention_days` days before the current hour (`period = "hour"`) or day.
//! Time is the database server's clock (`NOW()`).
//!
//! The DDL must not stall the application. An `ALTER TABLE` waits for every
//! transaction that has the table open, and statements arriving meanwhile queue
//! behind it; so each statement runs with `lock_wait_timeout = 1` (a statement of
//! the application waits at most about a second behind it) and is retried with a
//! growing pause when the lock was not granted. New days are split off the
//! catch-all partition only while it is empty (then the split copies nothing);
//! dropping a partition removes its rows without touching the others.
//!
//! Without `--apply` ([`JobContext::apply`] false) the job prints the statements
//! it would run and changes nothing.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::period::{day_sql, keep_from, parse_stamp, stamp_sql, Stamp, CATCH_ALL, DAY_SECS};
use super::schema::{partitions, Layout};
use super::spec::{PartitionSpec, Period};
use crate::error::{Error, OrErr, Result, Source};
use crate::kinds::{JobContext, JobReport};
use crate::schema::{emit, resolve_tables};

/// Attempts of one DDL statement whose lock was not granted.
pub const DDL_ATTEMPTS: u32 = 12;
/// Pause after the first refused attempt; doubled after each, at most [`MAX_PAUSE`].
pub const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// Longest pause between attempts.
pub const MAX_PAUSE: Duration = Duration::from_secs(4);
/// Seconds a rotation statement waits for its table lock (`lock_wait_timeout`).
pub const LOCK_WAIT_SECONDS: u32 = 0;

/// Partitions one rotation statement adds: the statement holds a lock that blocks
/// the application's writes while it creates its partitions (about 50 ms each on
/// this VM, more under load), so a table far behind is caught up in small steps.
pub const PARTITIONS_PER_DDL: usize = 3;

/// What the rotation must run on a table laid out as `layout` at `now`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RotationPlan {
    /// Partitions to drop (wholly older than the retention).
    pub drop: Vec<String>,
    /// The statements that add the missing periods (and the catch-all), in order,
    /// at most [`PARTITIONS_PER_DDL`] partitions each.
    pub add: Vec<String>,
    /// Why days could not be added (the catch-all partition holds rows).
    pub blocked: Option<String>,
}

/// The rotation of `layout` at `now` (`catch_all_empty`: the `MAXVALUE`
/// partition holds no row).
pub fn plan(
    spec: &PartitionSpec,
    table_sql: &str,
    layout: &Layout,
    now: Stamp,
    catch_all_empty: bool,
) -> RotationPlan {
    let mut out = RotationPlan::default();
    let period = spec.period;
    let keep_from = keep_from(spec, now);
    let want_last = period.add(now, i64::from(spec.premake));
    // Periods are added from the last partition's end, or from the first kept
    // time when that is later (the first new partition then also holds the
    // times before it, which are expired anyway).
    let first_new = layout
        .bounded
        .last()
        .map_or(period.floor(now), |(_, upper)| *upper)
        .max(keep_from);
    let new = if period.floor(first_new) <= want_last {
        period.partitions(first_new, want_last)
    } else {
        Vec::new()
    };
    let last = layout.bounded.last().map(|(name, _)| name.clone());
    for (name, upper) in &layout.bounded {
        if *upper <= keep_from {
            out.drop.push(name.clone());
        }
    }
    match (&layout.catch_all, new.is_empty()) {
        (Some(_), true) => {}
        (Some(pmax), false) if catch_all_empty => {
            let pmax = crate::rules::spec::quote(pmax);
            for parts in new.chunks(PARTITIONS_PER_DDL) {
                out.add.push(format!(
                    "ALTER TABLE {table_sql} REORGANIZE PARTITION {pmax} INTO ({}, {})",
                    parts.join(", "),
                    CATCH_ALL.replace("pmax", &pmax)
                ));
            }
        }
        (Some(pmax), false) => {
            out.blocked = Some(format!(
                "catch-all partition {pmax} holds rows, so {}s up to {} were not split off it (a split would copy them under a lock); move or delete those rows",
                period.word(),
                stamp_sql(want_last)
            ));
        }
        (None, _) => {
            let mut parts = new;
            parts.push(CATCH_ALL.to_string());
            for chunk in parts.chunks(PARTITIONS_PER_DDL) {
                out.add.push(format!(
                    "ALTER TABLE {table_sql} ADD PARTITION ({})",
                    chunk.join(", ")
                ));
            }
        }
    }
    // A RANGE table keeps at least one bounded partition.
    if out.add.is_empty() {
        out.drop.retain(|n| Some(n) != last.as_ref());
    }
    out
}

/// Runs one DDL statement with a short lock wait, retried with growing pauses
/// while its lock is not granted (1205) or the table changed under it.
pub async fn run_ddl(conn: &mut Conn, rule: &str, sql: &str) -> Result<u32> {
    let mut pause = FIRST_PAUSE;
    let stmt = format!("SET STATEMENT lock_wait_timeout = {LOCK_WAIT_SECONDS} FOR {sql}");
    for attempt in 1..=DDL_ATTEMPTS {
        match conn.query_drop(&stmt).await {
            Ok(()) => return Ok(attempt),
            Err(mysql_async::Error::Server(e))
                if (e.code == 1205 || e.code == 1213) && attempt < DDL_ATTEMPTS =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            Err(e) => {
                return Err(Error::with_cause(
                    Source::Backend,
                    format!("rule {rule}: executing `{sql}` (attempt {attempt})"),
                    e,
                ))
            }
        }
    }
    Err(Error::new(
        Source::Backend,
        format!("rule {rule}: `{sql}` did not get its lock"),
    ))
}

/// One run of the job.
pub async fn run(spec: &PartitionSpec, ctx: &mut JobContext<'_>) -> Result<JobReport> {
    let (table, _) = resolve_tables(&spec.table, &[], ctx.default_db)
        .map_err(|e| Error::new(Source::Rules, format!("rule {}: {e:?}", spec.name)))?;
    let layout = partitions(ctx.conn, &table, &spec.column).await?;
    let Some(layout) = layout else {
        return Ok(JobReport {
            summary: "not rotated".into(),
            failed: vec![format!(
                "table {} is not partitioned by RANGE COLUMNS ({}); run heatsink migrate",
                table.quoted(),
                spec.column
            )],
        });
    };
    let now: Option<String> = ctx
        .conn
        .query_first("SELECT CAST(NOW() AS CHAR)")
        .await
        .or_err(Source::Backend, || "reading NOW()".to_string())?;
    let now = now
        .as_deref()
        .and_then(parse_stamp)
        .ok_or_else(|| Error::new(Source::Backend, "NOW() did not answer a time".to_string()))?;
    let catch_all_empty = match &layout.catch_all {
        Some(p) => {
            let sql = format!(
                "SELECT 1 FROM {} PARTITION ({}) LIMIT 1",
                table.quoted(),
                crate::rules::spec::quote(p)
            );
            let row: Option<i64> = ctx
                .conn
                .query_first(&sql)
                .await
                .or_err(Source::Backend, || format!("reading partition {p}"))?;
            row.is_none()
        }
        None => true,
    };
    let p = plan(spec, &table.quoted(), &layout, now, catch_all_empty);
    let drop_sql = |names: &[String]| {
        (!names.is_empty()).then(|| {
            let quoted: Vec<String> = names.iter().map(|n| crate::rules::spec::quote(n)).collect();
            format!(
                "ALTER TABLE {} DROP PARTITION {}",
                table.quoted(),
                quoted.join(", ")
            )
        })
    };
    let window = if spec.period == Period::Day {
        let today = now.div_euclid(DAY_SECS);
        format!(
            "today {}, kept from {} to {}",
            day_sql(today),
            day_sql(today - i64::from(spec.retention_days)),
            day_sql(today + i64::from(spec.premake))
        )
    } else {
        format!(
            "now {}, kept from {} to the {} of {}",
            stamp_sql(now),
            stamp_sql(keep_from(spec, now)),
            spec.period.word(),
            stamp_sql(spec.period.add(now, i64::from(spec.premake)))
        )
    };
    let mut failed = Vec::new();
    if let Some(b) = &p.blocked {
        failed.push(b.clone());
    }
    if !ctx.apply {
        for sql in p.add.iter().chain(drop_sql(&p.drop).iter()) {
            emit(ctx.out, &format!("{sql};"))?;
        }
        let added: usize = p
            .add
            .iter()
            .map(|a| a.matches("VALUES LESS THAN ('").count())
            .sum();
        return Ok(JobReport {
            summary: format!(
                "dry run: {added} partitions would be added, {} dropped ({window})",
                p.drop.len()
            ),
            failed,
        });
    }
    let mut added = 0;
    let mut drop = p.drop.clone();
    for add in &p.add {
        emit(ctx.out, &format!("{add};"))?;
        match run_ddl(ctx.conn, &spec.name, add).await {
            Ok(_) => added += add.matches("VALUES LESS THAN ('").count(),
            Err(e) => {
                failed.push(e.to_string());
                // Without the new partitions, the last bounded one stays.
                let last = layout.bounded.last().map(|(n, _)| n.clone());
                drop.retain(|n| Some(n) != last.as_ref());
                break;
            }
        }
    }
    let mut dropped = 0;
    if let Some(sql) = drop_sql(&drop) {
        emit(ctx.out, &format!("{sql};"))?;
        let started = std::time::Instant::now();
        match run_ddl(ctx.conn, &spec.name, &sql).await {
            Ok(attempts) => {
                dropped = drop.len();
                emit(
                    ctx.out,
                    &format!(
                        "-- dropped in {:.3} s ({attempts} attempt{})",
                        started.elapsed().as_secs_f64(),
                        if attempts == 1 { "" } else { "s" }
                    ),
                )?;
            }
            Err(e) => failed.push(e.to_string()),
        }
    }
    Ok(JobReport {
        summary: format!("{added} partitions added, {dropped} dropped ({window})"),
        failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::partition::period::{parse_day, HOUR_SECS};

    #[test]
    fn days_round_trip() {
        for s in [
            "1970-01-01",
            "2024-02-29",
            "2024-03-01",
            "2000-12-31",
            "1999-01-01",
        ] {
            assert_eq!(day_sql(parse_day(s).unwrap()), s);
        }
        assert_eq!(parse_day("1970-01-02"), Some(1));
    }

    fn spec() -> PartitionSpec {
        let mut v: Vec<PartitionSpec> = crate::kinds::entries(
            "[[partition]]\nname = \"m\"\ntable = \"Messages\"\nkey = \"UUID\"\nkey_time = \"unix\"\n\
             column = \"Inserted\"\nretention_days = 3\npremake = 2\n",
            "partition",
        )
        .unwrap();
        v.remove(0)
    }

    #[test]
    fn rotation_drops_expired_days_and_splits_the_catch_all() {
        let d = |s: &str| parse_day(s).unwrap() * DAY_SECS;
        let layout = Layout {
            bounded: (0..6)
                .map(|i| {
                    (
                        Period::Day.name(d("2024-11-20") + i * DAY_SECS),
                        d("2024-11-21") + i * DAY_SECS,
                    )
                })
                .collect(),
            catch_all: Some("pmax".into()),
        };
        // Bounded days 11-20 … 11-25; today 11-25, retention 3, premake 2.
        let p = plan(&spec(), "`Messages`", &layout, d("2024-11-25"), true);
        assert_eq!(p.drop, ["p20241120", "p20241121"]);
        assert_eq!(
            p.add,
            ["ALTER TABLE `Messages` REORGANIZE PARTITION `pmax` INTO (\
              PARTITION p20241126 VALUES LESS THAN ('2024-11-27'), \
              PARTITION p20241127 VALUES LESS THAN ('2024-11-28'), \
              PARTITION `pmax` VALUES LESS THAN (MAXVALUE))"]
        );
        let busy = plan(&spec(), "`Messages`", &layout, d("2024-11-25"), false);
        assert!(busy.add.is_empty() && busy.blocked.is_some());
        // Far behind: the first new partition starts at the first kept day, and
        // every old one goes.
        let late = plan(&spec(), "`Messages`", &layout, d("2024-12-25"), true);
        assert_eq!(late.drop.len(), 6);
        // 2024-12-22 … 2024-12-27 in two steps of three days.
        assert_eq!(late.add.len(), 2);
        assert!(late.add[0].contains("INTO (PARTITION p20241222 VALUES LESS THAN ('2024-12-23'), "));
        let none = Layout {
            catch_all: None,
            ..layout
        };
        let p = plan(&spec(), "`Messages`", &none, d("2024-11-24"), true);
        assert_eq!(
            p.add,
            ["ALTER TABLE `Messages` ADD PARTITION (PARTITION p20241126 VALUES LESS THAN ('2024-11-27'), \
              PARTITION pmax VALUES LESS THAN (MAXVALUE))"]
        );
    }

    fn spec_with(period: &str, retention: u32, premake: u32) -> PartitionSpec {
        let mut v: Vec<PartitionSpec> = crate::kinds::entries(
            &format!(
                "[[partition]]\nname = \"m\"\ntable = \"Messages\"\nkey = \"UUID\"\nkey_time = \"unix\"\n\
                 column = \"Inserted\"\nperiod = \"{period}\"\nretention_days = {retention}\npremake = {premake}\n"
            ),
            "partition",
        )
        .unwrap();
        v.remove(0)
    }

    #[test]
    fn hours_and_months_rotate_by_their_period() {
        let t = |s: &str| parse_stamp(s).unwrap();
        let hours = spec_with("hour", 2, 3);
        let layout = Layout {
            bounded: vec![("p2025010100".into(), t("2025-01-01 01:00:00"))],
            catch_all: Some("pmax".into()),
        };
        let p = plan(&hours, "`M`", &layout, t("2025-01-01 10:00:30"), true);
        assert!(p.drop.is_empty());
        let added: Vec<&str> = p
            .add
            .iter()
            .flat_map(|a| a.split("PARTITION ").skip(2))
            .filter(|x| !x.starts_with("`pmax`"))
            .collect();
        assert_eq!(added.len(), 13, "{:?}", p.add);
        assert_eq!(
            added[0],
            "p2025010101 VALUES LESS THAN ('2025-01-01 02:00:00'), "
        );
        assert!(added[12].starts_with("p2025010113 VALUES LESS THAN ('2025-01-01 14:00:00')"));
        // Two days later: everything older than 2 days before the current hour goes.
        let later = Layout {
            bounded: (0..14)
                .map(|h| {
                    let start = t("2025-01-01 00:00:00") + h * HOUR_SECS;
                    (Period::Hour.name(start), start + HOUR_SECS)
                })
                .collect(),
            catch_all: Some("pmax".into()),
        };
        let p = plan(&hours, "`M`", &later, t("2025-01-03 11:10:00"), true);
        // Kept from 2025-01-01 11:00: the partitions ending at 11:00 or before go.
        assert_eq!(p.drop.len(), 11);
        assert_eq!(p.drop.last().map(String::as_str), Some("p2025010110"));
        assert!(p.add[0]
            .contains("INTO (PARTITION p2025010114 VALUES LESS THAN ('2025-01-01 15:00:00')"));

        let months = spec_with("month", 60, 2);
        let layout = Layout {
            bounded: vec![("p202501".into(), t("2025-02-01"))],
            catch_all: Some("pmax".into()),
        };
        let p = plan(&months, "`M`", &layout, t("2025-01-15 08:00:00"), true);
        assert!(p.drop.is_empty());
        assert_eq!(
            p.add,
            ["ALTER TABLE `M` REORGANIZE PARTITION `pmax` INTO (\
              PARTITION p202502 VALUES LESS THAN ('2025-03-01'), \
              PARTITION p202503 VALUES LESS THAN ('2025-04-01'), \
              PARTITION `pmax` VALUES LESS THAN (MAXVALUE))"]
        );
        let layout = Layout {
            bounded: vec![
                ("p202501".into(), t("2025-02-01")),
                ("p202502".into(), t("2025-03-01")),
                ("p202503".into(), t("2025-04-01")),
            ],
            catch_all: Some("pmax".into()),
        };
        // Kept from 2025-03-21: January and February go, March stays.
        let p = plan(&months, "`M`", &layout, t("2025-05-20 08:00:00"), true);
        assert_eq!(p.drop, ["p202501", "p202502"]);
        assert_eq!(p.add.len(), 2);
        assert!(p.add[0].contains("INTO (PARTITION p202504 VALUES LESS THAN ('2025-05-01'), "));
        assert!(p.add[1].contains("INTO (PARTITION p202507 VALUES LESS THAN ('2025-08-01'), "));
    }
}
