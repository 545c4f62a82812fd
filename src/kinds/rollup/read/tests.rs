use super::super::testutil::{engine_of, DAY_RULE};
use crate::rewrite::testutil::{
    assert_fallbacks, assert_passthrough, assert_sql, decide, parsed, reject, rewrite,
};
use crate::rewrite::{Decision, Engine, Reply};

/// An engine with a day rollup of `plays` by (track_id, country), and the log's
/// columns known for database `shop`.
fn engine() -> Engine {
    engine_with("")
}

fn engine_with(extra: &str) -> Engine {
    engine_of(&format!("{DAY_RULE}{extra}"))
}

const ROLLUP_COLS: &str = "IF((`p`.`hs_nulls` & 1) <> 0, NULL, `p`.`track_id`) AS `track_id`, IF((`p`.`hs_nulls` & 2) <> 0, NULL, `p`.`country`) AS `country`, `p`.`hs_rows` AS `hs_rows`";

#[test]
fn whole_buckets_from_the_rollup_edges_from_the_log() {
    let e = engine();
    let r = rewrite(
        &e,
        "SELECT track_id, country, COUNT(*) AS total FROM plays p WHERE track_id = 7 \
         AND created_at >= '2024-03-01 10:30:00' GROUP BY track_id, country",
    );
    let s = "IF(CAST(DATE_FORMAT(('2024-03-01 10:30:00'), '%Y-%m-%d 00:00:00') AS DATETIME) = ('2024-03-01 10:30:00'), \
             CAST(DATE_FORMAT(('2024-03-01 10:30:00'), '%Y-%m-%d 00:00:00') AS DATETIME), \
             CAST(DATE_FORMAT(('2024-03-01 10:30:00'), '%Y-%m-%d 00:00:00') AS DATETIME) + INTERVAL 1 DAY)";
    assert_sql(
        &r,
        &[&format!(
            "SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, `p`.`total` FROM (\
             SELECT `hs_u`.`track_id`, `hs_u`.`country`, CAST(COALESCE(SUM(`hs_u`.`hs_rows`), 0) AS SIGNED) AS `total` FROM (\
             SELECT {ROLLUP_COLS} FROM `plays_by_day` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 1) = 0 \
             AND `p`.`hs_bucket` >= {s} AND (`p`.`hs_nulls` & 2147483648) = 0 \
             UNION ALL SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, 1 AS `hs_rows` FROM plays AS `p` \
             WHERE (track_id = 7 AND created_at >= '2024-03-01 10:30:00') AND (`p`.`created_at` < {s} OR {s} IS NULL)) AS `hs_u` \
             GROUP BY `hs_u`.`track_id`, `hs_u`.`country` HAVING SUM(`hs_u`.`hs_rows`) > 0) AS `p` \
             ORDER BY `p`.`track_id`, `p`.`country`"
        )],
    );
    let Reply::Patched(patch) = &r.reply else {
        panic!("{:?}", r.reply)
    };
    assert_eq!(patch.computed.len(), 3);
}

#[test]
fn all_time_totals_read_the_rollup_alone() {
    let e = engine();
    let r = rewrite(&e, "SELECT COUNT(*) AS n FROM plays WHERE country IS NULL");
    assert_sql(
        &r,
        &["SELECT `plays`.`n` FROM (SELECT CAST(COALESCE(SUM(`hs_u`.`hs_rows`), 0) AS SIGNED) AS `n` \
           FROM (SELECT `plays`.`hs_rows` AS `hs_rows` FROM `plays_by_day` AS `plays` \
           WHERE (`plays`.`hs_nulls` & 2) <> 0) AS `hs_u`) AS `plays`"],
    );
}

#[test]
fn other_reads_fall_back_and_writes_pass() {
    let e = engine();
    let fallbacks = [
        // A comment in an unaliased item: MariaDB names it without the comment.
        "SELECT COUNT(/* all */ *) FROM plays WHERE track_id = 1",
        "SELECT user_id, COUNT(*) AS n FROM plays GROUP BY user_id",
        "SELECT track_id, COUNT(*) AS n FROM plays GROUP BY track_id HAVING n > 1",
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE created_at > RAND() GROUP BY track_id",
        "SELECT DATE_FORMAT(created_at, '%Y-%m-%d %H') AS h, COUNT(*) AS n FROM plays GROUP BY h",
    ];
    assert_fallbacks(&e, &fallbacks);
    let passed = [
        "SELECT * FROM plays WHERE id = 1",
        "INSERT INTO plays (track_id) VALUES (RAND())",
        "UPDATE plays SET country = 'x' WHERE id = 1",
        "DELETE FROM plays WHERE id = 1",
        // The parser cannot read these; the triggers keep the rollups anyway.
        "UPDATE LOW_PRIORITY plays SET country = 'x' WHERE id = 1",
        "DELETE QUICK FROM plays WHERE id = 1",
    ];
    assert_passthrough(&e, &passed);
    assert!(reject(&e, "TRUNCATE TABLE plays").contains("fires no trigger"));
    assert!(reject(&e, "ALTER TABLE plays ADD COLUMN x INT").contains("rollup"));
}

/// An unaliased aggregate is computed under the proxy's alias and named as the
/// client spelt it; two spellings of one fingerprint get their own names (the
/// plan is cached per spelling), and other literals share the spelling's plan.
#[test]
fn unaliased_aggregates_are_named_as_spelt() {
    use sqlparser::ast::{SelectItem, SetExpr, Statement};
    let e = engine();
    let outer_names = |sql: &str| -> Vec<String> {
        let rw = rewrite(&e, sql);
        let text = String::from_utf8(rw.statements[0].clone()).expect("utf-8");
        let stmt = crate::rewrite::parse_statements(&text)
            .expect("parses")
            .remove(0);
        let Statement::Query(q) = stmt else {
            panic!("{text}: not a query")
        };
        let SetExpr::Select(sel) = *q.body else {
            panic!("{text}: not a select")
        };
        sel.projection
            .iter()
            .map(|i| match i {
                SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
                other => other.to_string(),
            })
            .collect()
    };
    assert_eq!(
        outer_names("SELECT COUNT(*) FROM plays WHERE track_id = 1"),
        ["COUNT(*)"]
    );
    assert_eq!(
        outer_names("SELECT COUNT( *\n) FROM plays WHERE track_id = 2"),
        ["COUNT( *\n)"]
    );
    assert_eq!(
        outer_names("SELECT track_id, COUNT(*) AS n, count(*) FROM plays GROUP BY track_id"),
        ["track_id", "`plays`.`n`", "count(*)"]
    );
}

/// An hour rollup with the read's dimensions (in another order) gives the whole
/// hours of the edges; the log only the partial hours.
/// Text reads with a time range also carry the two-step form: the bounds
/// computed first, then every part signed between literal boundaries.
#[test]
fn literal_bounds_sign_the_parts_between_boundaries() {
    use crate::rewrite::testutil::{decide_prepared, parsed};
    use crate::wire::resultset::types::DATETIME;
    let e = engine_of(&format!(
        "{DAY_RULE}[[rollup]]\nname = \"by_hour\"\ntable = \"plays\"\nrollup_table = \"plays_by_hour\"\n\
         time = \"created_at\"\nbucket = \"hour\"\ndimensions = [\"track_id\", \"country\"]\n"
    ));
    let sql = "SELECT track_id, country, COUNT(*) AS total FROM plays p WHERE track_id = 7 \
               AND created_at BETWEEN NOW() - INTERVAL 7 DAY AND NOW() GROUP BY track_id, country";
    let rw = rewrite(&e, sql);
    let p = rw.prelude.as_deref().expect("a two-step form");
    assert_eq!(
        parsed(&[&p.query]),
        parsed(&["SELECT CAST((NOW() - INTERVAL 7 DAY) AS DATETIME(6)), CAST((NOW()) AS DATETIME(6)), NOW()"])
    );
    let row: [Option<&[u8]>; 3] = [
        Some(b"2026-11-19 18:24:13.000000"),
        Some(b"2026-11-26 18:24:13.000000"),
        Some(b"2026-11-26 18:24:13"),
    ];
    let got = p.statements_for(&row, &[DATETIME; 3]).expect("literals");
    let ts = |v: &str| format!("TIMESTAMP'{v}.000000'");
    let (l, u) = (ts("2026-11-19 18:24:13"), ts("2026-11-26 18:24:13"));
    let (dl, du, hl, hu) = (
        ts("2026-11-20 00:00:00"),
        ts("2026-11-27 00:00:00"),
        ts("2026-11-19 18:00:00"),
        ts("2026-11-26 19:00:00"),
    );
    let b = "`p`.`hs_bucket`";
    let t = "`p`.`created_at`";
    let signed =
        |w: &str| ROLLUP_COLS.replace("`p`.`hs_rows` AS", &format!("({w}) * `p`.`hs_rows` AS"));
    let expected = format!(
        "SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, `p`.`total` FROM (\
         SELECT `hs_u`.`track_id`, `hs_u`.`country`, CAST(COALESCE(SUM(`hs_u`.`hs_rows`), 0) AS SIGNED) AS `total` FROM (\
         SELECT {} FROM `plays_by_day` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 1) = 0 \
         AND (({b} >= {dl} AND {b} < {du}) OR ({b} >= {du} AND {b} < {dl})) AND (`p`.`hs_nulls` & 2147483648) = 0 \
         UNION ALL SELECT {} FROM `plays_by_hour` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 1) = 0 \
         AND (({b} >= {hl} AND {b} < {dl}) OR ({b} >= {dl} AND {b} < {hl}) \
              OR ({b} >= {du} AND {b} < {hu}) OR ({b} >= {hu} AND {b} < {du})) \
         AND (`p`.`hs_nulls` & 2147483648) = 0 \
         UNION ALL SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, \
         (({t} >= {l}) - ({t} >= {hl}) + ({t} >= {hu}) - ({t} > {u})) AS `hs_rows` FROM plays AS `p` \
         WHERE track_id = 7 AND (({t} >= {l} AND {t} < {hl}) OR ({t} >= {hl} AND {t} < {l}) \
              OR ({t} >= {hu} AND {t} <= {u}) OR ({t} > {u} AND {t} < {hu}))) AS `hs_u` \
         GROUP BY `hs_u`.`track_id`, `hs_u`.`country` HAVING SUM(`hs_u`.`hs_rows`) > 0) AS `p` \
         ORDER BY `p`.`track_id`, `p`.`country`",
        signed(&format!("({b} >= {dl}) - ({b} >= {du})")),
        signed(&format!("({b} >= {hl}) - ({b} >= {dl}) + ({b} >= {du}) - ({b} >= {hu})")),
    );
    assert_eq!(parsed(&got), parsed(&[&expected]));
    // A NULL bound, or another type, runs the one-step form.
    let null: [Option<&[u8]>; 3] = [None, row[1], row[2]];
    assert_eq!(p.statements_for(&null, &[DATETIME; 3]), None);
    // Prepared statements keep the one-step form.
    match decide_prepared(&e, sql) {
        Decision::Rewrite(r) => assert!(r.prelude.is_none()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn edges_from_a_finer_rollup() {
    let hour = |dims: &str, extra: &str| {
        engine_of(&format!(
            "{DAY_RULE}[[rollup]]\nname = \"by_hour\"\ntable = \"plays\"\nrollup_table = \"plays_by_hour\"\n\
             time = \"created_at\"\nbucket = \"hour\"\ndimensions = [{dims}]\n{extra}"
        ))
    };
    let sql = "SELECT track_id, country, COUNT(*) AS total FROM plays p WHERE track_id = 7 \
               AND created_at >= '2024-03-01 10:30:00' GROUP BY track_id, country";
    let lower = "'2024-03-01 10:30:00'";
    let ceil = |fmt: &str, unit: &str| {
        let f = format!("CAST(DATE_FORMAT(({lower}), '{fmt}') AS DATETIME)");
        format!("IF({f} = ({lower}), {f}, {f} + INTERVAL 1 {unit})")
    };
    let (s, sh) = (
        ceil("%Y-%m-%d 00:00:00", "DAY"),
        ceil("%Y-%m-%d %H:00:00", "HOUR"),
    );
    let hour_cols = "IF((`p`.`hs_nulls` & 2) <> 0, NULL, `p`.`track_id`) AS `track_id`, \
                     IF((`p`.`hs_nulls` & 1) <> 0, NULL, `p`.`country`) AS `country`, `p`.`hs_rows` AS `hs_rows`";
    let expected = format!(
        "SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, `p`.`total` FROM (\
         SELECT `hs_u`.`track_id`, `hs_u`.`country`, CAST(COALESCE(SUM(`hs_u`.`hs_rows`), 0) AS SIGNED) AS `total` FROM (\
         SELECT {ROLLUP_COLS} FROM `plays_by_day` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 1) = 0 \
         AND `p`.`hs_bucket` >= {s} AND (`p`.`hs_nulls` & 2147483648) = 0 \
         UNION ALL SELECT {hour_cols} FROM `plays_by_hour` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 2) = 0 \
         AND `p`.`hs_bucket` >= {sh} AND `p`.`hs_bucket` < {s} AND (`p`.`hs_nulls` & 2147483648) = 0 \
         UNION ALL SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, 1 AS `hs_rows` FROM plays AS `p` \
         WHERE (track_id = 7 AND created_at >= '2024-03-01 10:30:00') AND (`p`.`created_at` < {sh} OR {sh} IS NULL)) AS `hs_u` \
         GROUP BY `hs_u`.`track_id`, `hs_u`.`country` HAVING SUM(`hs_u`.`hs_rows`) > 0) AS `p` \
         ORDER BY `p`.`track_id`, `p`.`country`"
    );
    assert_sql(
        &rewrite(&hour("\"country\", \"track_id\"", ""), sql),
        &[&expected],
    );
    // Without a dimension the read needs, or in shadow mode, the hour rollup
    // takes no part: the edges come from the log.
    let alone = rewrite(&engine(), sql);
    for e in [
        hour("\"track_id\"", ""),
        hour("\"country\", \"track_id\"", "mode = \"shadow\"\n"),
    ] {
        assert_eq!(rewrite(&e, sql).statements, alone.statements);
    }
}

/// A TIMESTAMP log: UTC buckets from the bounds' `UNIX_TIMESTAMP`, the log's
/// edges tested exactly on `UNIX_TIMESTAMP` behind a widened range; time series
/// (days of the session's zone) fall back.
#[test]
fn timestamp_logs_have_utc_buckets() {
    let e = super::super::testutil::engine_with_time(
        DAY_RULE,
        crate::wire::resultset::types::TIMESTAMP,
    );
    let r = rewrite(
        &e,
        "SELECT track_id, country, COUNT(*) AS total FROM plays p WHERE track_id = 7 \
         AND created_at >= '2024-03-01 10:30:00' GROUP BY track_id, country",
    );
    let secs = "(CEILING(UNIX_TIMESTAMP('2024-03-01 10:30:00') / 86400) * 86400)";
    let s = format!("IFNULL({secs}, 253402300799)");
    assert_sql(
        &r,
        &[&format!(
            "SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, `p`.`total` FROM (\
             SELECT `hs_u`.`track_id`, `hs_u`.`country`, CAST(COALESCE(SUM(`hs_u`.`hs_rows`), 0) AS SIGNED) AS `total` FROM (\
             SELECT {ROLLUP_COLS} FROM `plays_by_day` AS `p` WHERE track_id = 7 AND (`p`.`hs_nulls` & 1) = 0 \
             AND `p`.`hs_bucket` >= ('1970-01-01 00:00:00' + INTERVAL {secs} SECOND) AND (`p`.`hs_nulls` & 2147483648) = 0 \
             UNION ALL SELECT `p`.`track_id` AS `track_id`, `p`.`country` AS `country`, 1 AS `hs_rows` FROM plays AS `p` \
             WHERE (track_id = 7 AND created_at >= '2024-03-01 10:30:00') \
             AND (`p`.`created_at` <= FROM_UNIXTIME(LEAST({s} + 7200, 2147483647)) AND UNIX_TIMESTAMP(`p`.`created_at`) < {s})) AS `hs_u` \
             GROUP BY `hs_u`.`track_id`, `hs_u`.`country` HAVING SUM(`hs_u`.`hs_rows`) > 0) AS `p` \
             ORDER BY `p`.`track_id`, `p`.`country`"
        )],
    );
    let series =
        "SELECT DATE(created_at) AS d, COUNT(*) AS n FROM plays WHERE track_id = 7 GROUP BY d";
    assert!(matches!(decide(&e, series), Decision::Fallback(_)));
}

/// Bounds whose one-step boundaries could be NULL (read differently by
/// comparisons and `IS NULL` under NO_ZERO_DATE) or overflow with warnings:
/// prepared reads fall back; text reads keep the two-step form and forward the
/// statement as sent when the bounds' values decline it.
#[test]
fn bounds_the_one_step_form_cannot_take_exactly() {
    use crate::rewrite::testutil::decide_prepared;
    let e = engine();
    let read = |w: &str| format!("SELECT COUNT(*) AS n FROM plays WHERE track_id = 7 AND {w}");
    let fallback = [
        "created_at BETWEEN '0000-00-00' AND '2026-11-24'",
        "created_at >= 0",
        "created_at BETWEEN 0 AND NOW()",
        "created_at >= '9999-12-31 23:59:59'",
        "created_at >= '2024-02-30'",
        "created_at >= 20240301",
        "created_at >= ? - INTERVAL ? DAY",
        "created_at >= DATE(?) + INTERVAL 300 YEAR",
        "created_at >= NOW() - INTERVAL (DATEDIFF(NOW(), '2024-03-15') * 24) HOUR",
        "created_at >= NOW() - INTERVAL 300 YEAR",
        "created_at >= '1100-01-01' - INTERVAL 1 DAY",
    ];
    for w in fallback {
        let sql = read(w);
        assert!(
            matches!(decide_prepared(&e, &sql), Decision::Fallback(_)),
            "{sql}"
        );
        if !w.contains('?') {
            let rw = rewrite(&e, &sql);
            let p = rw.prelude.as_deref().expect("a two-step form");
            assert!(p.original.is_some(), "{sql}");
        }
    }
    let rewritten = [
        "created_at BETWEEN '2024-03-01' AND '2024-03-09 10:30:00'",
        "created_at >= NOW() - INTERVAL 7 DAY",
        "created_at < DATE(UTC_TIMESTAMP(6)) + INTERVAL 1 MONTH",
        "created_at >= '2024-03-25 13:27:00' - INTERVAL 3 DAY",
        "created_at > CURDATE()",
    ];
    for w in rewritten {
        let sql = read(w);
        assert!(
            matches!(decide_prepared(&e, &sql), Decision::Rewrite(_)),
            "{sql}"
        );
    }
    // A parameter is taken where a literal is, with a check of its value at each
    // execute (the years a literal would have to be in).
    use crate::rewrite::ParamCheck;
    let plain = ParamCheck::Datetime {
        min_year: 1000,
        max_year: 9998,
    };
    let shifted = ParamCheck::Datetime {
        min_year: 1201,
        max_year: 9798,
    };
    for (w, checks) in [
        ("created_at >= ?", vec![(0, plain)]),
        ("? <= created_at", vec![(0, plain)]),
        (
            "created_at BETWEEN ? - INTERVAL 7 DAY AND DATE(?)",
            vec![(0, shifted), (1, plain)],
        ),
        ("created_at < NOW() AND created_at > ?", vec![(0, plain)]),
    ] {
        let sql = read(w);
        match decide_prepared(&e, &sql) {
            Decision::Rewrite(rw) => assert_eq!(rw.param_checks, checks, "{sql}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
}

/// A dimension compared with a value of another kind is converted as the
/// plan decides (`track_id = 2.4` through an index finds the `2` rows).
#[test]
fn values_of_another_kind_than_the_dimension_fall_back() {
    let e = engine();
    assert_fallbacks(
        &e,
        &[
            "SELECT COUNT(*) AS n FROM plays WHERE track_id = 2.4",
            "SELECT COUNT(*) AS n FROM plays WHERE track_id = '2'",
            "SELECT COUNT(*) AS n FROM plays WHERE track_id IN (1, 2e0)",
            "SELECT COUNT(*) AS n FROM plays WHERE country = 0",
            "SELECT COUNT(*) AS n FROM plays WHERE -country = 'x'",
        ],
    );
    for sql in [
        "SELECT COUNT(*) AS n FROM plays WHERE track_id = -2",
        "SELECT COUNT(*) AS n FROM plays WHERE track_id IN (1, 2) AND country = 'DE'",
    ] {
        assert!(matches!(decide(&e, sql), Decision::Rewrite(_)), "{sql}");
    }
}

#[test]
fn shadow_mode_only_reports() {
    let e = engine_with("mode = \"shadow\"\n");
    let sql = "SELECT country, COUNT(*) AS n FROM plays WHERE track_id = 1 GROUP BY country";
    match decide(&e, sql) {
        Decision::Shadow(would) => assert!(matches!(*would, Decision::Rewrite(_))),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        decide(&e, "TRUNCATE TABLE plays"),
        Decision::Shadow(_)
    ));
}

#[test]
fn statements_the_parser_cannot_read_run_as_sent() {
    let e = engine();
    assert_fallbacks(
        &e,
        &[
            "LOAD DATA LOCAL INFILE 'plays.csv' INTO TABLE plays FIELDS TERMINATED BY ','",
            "LOAD DATA INFILE '/tmp/p' REPLACE INTO TABLE plays (created_at, track_id) SET country = 'US'",
            "SELECT COUNT(*) AS n FROM plays INTO @a",
            "SELECT track_id FROM plays INTO OUTFILE '/tmp/x'",
            "SELECT COUNT(*) AS n INTO @a FROM plays",
            "SET STATEMENT max_statement_time = 10 FOR SELECT COUNT(*) AS n FROM plays",
            "SET STATEMENT sql_mode = 'ANSI_QUOTES' FOR SELECT COUNT(*) AS n FROM plays",
            // EXTRACT's compound units are not an interval's.
            "SELECT EXTRACT(DAY_HOUR FROM created_at) AS dh, COUNT(*) AS n FROM plays GROUP BY dh",
            "SELECT COUNT(*) AS n FROM plays WHERE EXTRACT(YEAR_MONTH FROM created_at) = 202405",
        ],
    );
    // DDL the parser cannot read is still refused: no trigger follows it.
    let r = reject(&e, "ALTER TABLE plays TRUNCATE PARTITION p0");
    assert!(r.contains("cannot be parsed"), "{r}");
}

#[test]
fn compound_interval_units_are_read() {
    let e = engine();
    let compound =
        "SELECT COUNT(*) AS n FROM plays WHERE created_at >= NOW() - INTERVAL '1:30' hour_minute \
                    AND created_at < DATE_ADD('2024-05-01', INTERVAL (1 + 1) DAY_HOUR)";
    // The standard spelling, which the parser reads (and MariaDB refuses): the
    // engine leaves it as written, so its rewrite is the reference.
    let standard = "SELECT COUNT(*) AS n FROM plays WHERE created_at >= NOW() - INTERVAL '1:30' HOUR TO MINUTE \
                    AND created_at < DATE_ADD('2024-05-01', INTERVAL (1 + 1) DAY TO HOUR)";
    let (r, want) = (rewrite(&e, compound), rewrite(&e, standard));
    // Every text of the rewrite has the units as MariaDB reads them; read with
    // the standard spelling, it is the reference rewrite.
    let standard_of = |text: &[u8]| {
        let text = String::from_utf8_lossy(text);
        assert!(!text.contains(" TO "), "{text}");
        text.replace("HOUR_MINUTE", "HOUR TO MINUTE")
            .replace("DAY_HOUR", "DAY TO HOUR")
    };
    let texts = |r: &crate::rewrite::Rewritten| -> Vec<Vec<u8>> {
        let p = r.prelude.as_deref().expect("a two-step form");
        let mut all = r.statements.clone();
        all.push(p.query.clone());
        all.extend(p.statements.iter().map(|(t, holes)| {
            // Holes (where the bounds go) become a literal, the same in both.
            let mut out = Vec::new();
            let mut at = 0;
            for &(offset, _) in holes {
                out.extend_from_slice(&t[at..offset]);
                out.extend_from_slice(b"'2024-05-01'");
                at = offset;
            }
            out.extend_from_slice(&t[at..]);
            out
        }));
        all
    };
    let got: Vec<String> = texts(&r).iter().map(|t| standard_of(t)).collect();
    assert_eq!(parsed(&got), parsed(&texts(&want)));
    // Prepared reads have only the one-step form, which takes a compound unit whose
    // literal bounds the shift (at most 200 years in all).
    let prepared = |w: &str| {
        crate::rewrite::testutil::decide_prepared(
            &e,
            &format!("SELECT COUNT(*) AS n FROM plays WHERE created_at >= {w}"),
        )
    };
    for w in [
        "? - INTERVAL '1:30' HOUR_MINUTE",
        "NOW() - INTERVAL '1 12' DAY_HOUR",
        "'2024-03-01' - INTERVAL 2 DAY_HOUR",
        "NOW() - INTERVAL '-1 2:03' DAY_MINUTE",
        "NOW() - INTERVAL '1-6' YEAR_MONTH",
        "NOW() + INTERVAL 1.5 MINUTE_SECOND",
    ] {
        assert!(matches!(prepared(w), Decision::Rewrite(_)), "{w}");
    }
    for w in [
        "NOW() - INTERVAL '1e3' DAY_HOUR",
        "NOW() - INTERVAL '0x10' DAY_HOUR",
        "NOW() - INTERVAL '1 2 3 4 5 6' DAY_MICROSECOND",
        "'2024-03-01' - INTERVAL '100000 0' DAY_HOUR",
        "NOW() - INTERVAL '200 1' YEAR_MONTH",
        "NOW() - INTERVAL ? DAY_HOUR",
    ] {
        assert!(matches!(prepared(w), Decision::Fallback(_)), "{w}");
    }
}

#[test]
fn set_statement_keeps_its_prefix_on_every_statement() {
    let e = engine();
    let read = "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id = 7 \
                AND created_at >= '2024-03-01 10:30:00' GROUP BY track_id";
    let plain = rewrite(&e, read);
    let prefixed = rewrite(
        &e,
        &format!("SET STATEMENT time_zone = '+10:00', div_precision_increment = 6 FOR {read}"),
    );
    let prefix: &[u8] = b"SET STATEMENT time_zone = '+10:00', div_precision_increment = 6 FOR ";
    let rest = |texts: &[Vec<u8>]| -> Vec<Vec<u8>> {
        texts
            .iter()
            .map(|t| {
                assert!(t.starts_with(prefix), "{}", String::from_utf8_lossy(t));
                t[prefix.len()..].to_vec()
            })
            .collect()
    };
    assert_eq!(
        parsed(&rest(&prefixed.statements)),
        parsed(&plain.statements)
    );
    let (pa, pb) = (
        plain.prelude.as_deref().expect("a two-step form"),
        prefixed.prelude.as_deref().expect("a two-step form"),
    );
    assert_eq!(
        parsed(&rest(std::slice::from_ref(&pb.query))),
        parsed(&[&pa.query])
    );
    // The holes moved with the text: the same literals land in the same places.
    // (The read has a lower bound only: the row is that bound.)
    let row: [Option<&[u8]>; 1] = [Some(b"2024-03-01 10:30:00.000000")];
    let types = [0x0c];
    let sa = pa.statements_for(&row, &types).expect("the row's literals");
    let sb = pb.statements_for(&row, &types).expect("the row's literals");
    assert_eq!(parsed(&rest(&sb)), parsed(&sa));
    assert!(pb
        .original
        .as_deref()
        .is_some_and(|o| o.starts_with(b"SET STATEMENT time_zone")));
}

#[test]
fn the_servers_plan_is_asked_only_where_the_shape_does_not_settle_it() {
    let probed = |e: &Engine, sql: &str| rewrite(e, sql).probe.is_some();
    let e = engine();
    for sql in [
        // The grouped column leads an index; a range, a second grouped column or
        // another indexed filter competes.
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (1, 2) \
         AND created_at >= '2024-03-01' GROUP BY track_id",
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE created_at < NOW() GROUP BY track_id ORDER BY n DESC",
        "SELECT track_id, country, COUNT(*) AS n FROM plays GROUP BY track_id, country",
    ] {
        assert!(probed(&e, sql), "{sql}");
        let p = rewrite(&e, sql).probe.expect("a probe");
        assert_eq!(
            p.explain,
            [crate::rewrite::EXPLAIN_JSON, sql.as_bytes()].concat()
        );
    }
    for sql in [
        "SELECT track_id, COUNT(*) AS n FROM plays GROUP BY track_id",
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (1, 2) GROUP BY track_id ORDER BY n",
        // No grouped column in an index: a temporary table on any data.
        "SELECT country, COUNT(*) AS n FROM plays WHERE created_at >= '2024-03-01' GROUP BY country",
        // Fixed to one value, or no groups.
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id = 1 AND created_at >= '2024-03-01' GROUP BY track_id",
        "SELECT COUNT(*) AS n FROM plays WHERE track_id IN (1, 2) AND created_at >= '2024-03-01'",
    ] {
        assert!(!probed(&e, sql), "{sql}");
    }
    let predicted = engine_with("exact_flags = false\n");
    let sql = "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (1, 2) \
               AND created_at >= '2024-03-01' GROUP BY track_id";
    assert!(!probed(&predicted, sql), "exact_flags = false");
}

#[test]
fn the_plan_explain_reports_picks_the_flags() {
    use super::columns::{explained_mode, PlanMode};
    let table = |key: &str, part: &str| {
        format!(
            r#"{{"table": {{"table_name": "plays", "access_type": "range", "key": "{key}", "used_key_parts": ["{part}"], "rows": 20118}}}}"#
        )
    };
    let doc = |inner: String| format!(r#"{{"query_block": {{"select_id": 1, {inner}}}}}"#);
    let nested = |t: String| format!(r#""nested_loop": [{t}]"#);
    let temporary = |t: String| format!(r#""temporary_table": {{{}}}"#, nested(t));
    let sorted =
        |t: String, key: &str| format!(r#""filesort": {{"sort_key": "{key}", {}}}"#, temporary(t));
    let open = ["track_id".to_string()];
    let mode = |d: &str, by_aggregate: bool| explained_mode(d.as_bytes(), &open, by_aggregate);
    // Measured (docs/design.md): the track index in index order; then sorted by the
    // count; the time index through a temporary table, sorted or not.
    let by_track = doc(nested(table("track_id", "track_id")));
    assert_eq!(mode(&by_track, false), Some(PlanMode::Index));
    let by_track_sorted = doc(sorted(table("track_id", "track_id"), "count(0) desc"));
    assert_eq!(
        mode(&by_track_sorted, true),
        Some(PlanMode::IndexThenTemporary)
    );
    let by_time = doc(sorted(table("created_at", "created_at"), "plays.track_id"));
    assert_eq!(mode(&by_time, false), Some(PlanMode::Temporary));
    assert_eq!(mode(&by_time, true), Some(PlanMode::Temporary));
    let unsorted = doc(temporary(table("created_at", "created_at")));
    assert_eq!(mode(&unsorted, false), Some(PlanMode::Temporary));
    let scan = doc(temporary(
        r#"{"table": {"table_name": "plays", "access_type": "ALL", "rows": 6000}}"#.into(),
    ));
    assert_eq!(mode(&scan, false), Some(PlanMode::Temporary));
    // Not measured, so not guessed.
    for d in [
        // The grouped column's index with a temporary table, no aggregate order.
        by_track_sorted.clone(),
        // Another index in read order, or a sort without a temporary table.
        doc(nested(table("created_at", "created_at"))),
        doc(format!(
            r#""filesort": {{"sort_key": "plays.track_id", {}}}"#,
            nested(table("created_at", "created_at"))
        )),
        // A loose index scan, a message, two tables, an unknown node.
        doc(nested(
            r#"{"table": {"key": "track_id", "used_key_parts": ["track_id"], "using_index_for_group_by": true}}"#
                .into(),
        )),
        doc(r#""table": {"message": "Impossible WHERE noticed after reading const tables"}"#.into()),
        doc(format!(
            r#""nested_loop": [{}, {}]"#,
            table("track_id", "track_id"),
            table("created_at", "created_at")
        )),
        doc(format!(r#""duplicate_removal": {{{}}}"#, nested(table("track_id", "track_id")))),
        "not json".into(),
        "[]".into(),
    ] {
        assert_eq!(mode(&d, false), None, "{d}");
    }
}
