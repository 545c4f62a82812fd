//! Differential fuzzing of the rollup rule (`tests/common/differential.rs`): seeded
//! aggregate reads of a play log — dimension filters, ragged time ranges, time
//! series, totals, `ORDER BY`/`LIMIT`, and shapes the rollups cannot answer — run
//! through heatsink on a log with three rollups (the per-country day rollup reads
//! the ragged edges of its ranges from the per-country hour rollup), and directly on a plain log, in both
//! protocols, under changing character sets and sql_modes, interleaved with writes
//! (single and multi-row inserts, `INSERT … SELECT`, updates of dimensions and times,
//! deletes) that the triggers must fold into the rollups exactly. Every answer must
//! be the reference's.

mod common;

use common::differential::{Gen, Kind, Lit, Order, Stmt};
use common::packets::GROUPED_FLAGS_BY_PLAN;
use common::rawclient::RawParam;

/// Statements per round in the bounded run.
const STATEMENTS: usize = 1200;
/// Rounds in the bounded run.
const ROUNDS: u64 = 2;
/// The bounded run's seed.
const SEED: u64 = 20_261_126;

/// The log.
const LOG: &str = "plays";

#[test]
fn rollup_reads_match_the_log() {
    common::differential::run_bounded(&Rollup { utc: false }, SEED, STATEMENTS, ROUNDS);
}

/// 16 concurrent sessions, about half of them after a state change from the
/// catalogue (`common::differential::STATE_CLASSES`), insert into the log through
/// heatsink (group commit at its default) and directly: every answer and the log must
/// match.
#[test]
fn rollup_sessions_match_direct() {
    common::differential::run_sessions_bounded(&Rollup { utc: false }, SEED + 200, 16, 12, 2);
}

/// The same on the log whose time column is a TIMESTAMP (a session's time zone
/// changes what a literal time stores).
#[test]
fn rollup_timestamp_sessions_match_direct() {
    common::differential::run_sessions_bounded(&Rollup { utc: true }, SEED + 201, 16, 12, 2);
}

/// The same on a log whose time column is a TIMESTAMP (the rollups' buckets are of
/// UTC; sessions write and read it in their own time zones).
#[test]
fn rollup_reads_of_a_timestamp_log_match_the_log() {
    common::differential::run_bounded(&Rollup { utc: true }, SEED + 77, STATEMENTS, ROUNDS);
}

/// The generator's shapes are answered from the rollups (the differential run
/// would pass just as well if they all fell back to the log), and the shapes
/// documented as fallbacks are.
#[test]
fn generated_shapes_are_answered_from_the_rollups() {
    let rules = common::client::rules_dir("rollup.toml", &Rollup { utc: false }.rule_toml());
    let dir = rules.path().to_str().expect("utf-8 path");
    let rewritten = [
        "SELECT track_id, country, COUNT(*) AS total FROM plays WHERE track_id = 1 AND created_at BETWEEN NOW() - INTERVAL 7 DAY AND NOW() GROUP BY track_id, country",
        "SELECT COUNT(*) AS n FROM plays p WHERE p.track_id IN (1, 2) AND p.country IS NULL",
        "SELECT DATE(created_at) AS d, COUNT(*) AS n FROM plays WHERE track_id = 1 GROUP BY d",
        "SELECT DATE_FORMAT(created_at, '%Y-%m-%d %H:00:00') AS h, COUNT(*) AS n FROM plays GROUP BY 1 ORDER BY n DESC, 1 LIMIT 3",
        "SELECT country, COUNT(*) AS n, COUNT(user_id) AS u FROM plays WHERE created_at > '2024-03-01 10:30:00' AND created_at <= '2024-03-09' GROUP BY country",
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE created_at >= NOW() - INTERVAL (DATEDIFF(NOW(), '2024-03-15') * 24 + 5) HOUR GROUP BY track_id",
        "SELECT COUNT(*) FROM plays WHERE track_id = 1",
        "SELECT country, count( * ), SUM(user_id) FROM plays GROUP BY country",
    ];
    let fallbacks = [
        "SELECT COUNT(/* all */ *) FROM plays WHERE track_id = 1",
        "SELECT user_id, COUNT(*) AS n FROM plays GROUP BY user_id",
        "SELECT track_id, AVG(user_id) AS a FROM plays GROUP BY track_id",
        "SELECT DATE_FORMAT(created_at, '%Y-%m-%d %H:%i') AS m, COUNT(*) AS n FROM plays GROUP BY m",
    ];
    for (sql, want) in rewritten.iter().map(|q| (q, "rewritten by rule")).chain(
        fallbacks
            .iter()
            .map(|q| (q, "counted as the rule's fallback")),
    ) {
        let (code, out, err) =
            common::cli::heatsink(&["explain", "--rules", dir, "--db", "shop", sql]);
        assert_eq!(code, 0, "{sql}\n{err}");
        assert!(out.contains(want), "{sql}: expected `{want}`\n{out}");
    }
    // The per-country read takes whole hours of its edges from the hour rollup by
    // country.
    let (_, out, _) =
        common::cli::heatsink(&["explain", "--rules", dir, "--db", "shop", rewritten[0]]);
    assert!(out.contains("`plays_by_country_hour`"), "{out}");
}

struct Rollup {
    /// The log's time column is a TIMESTAMP.
    utc: bool,
}

impl Kind for Rollup {
    fn name(&self) -> &'static str {
        if self.utc {
            "rollup_ts"
        } else {
            "rollup"
        }
    }

    fn schema(&self) -> String {
        let mut rows = Vec::new();
        let mut g = common::differential::Prng::new(7);
        for i in 0..400u64 {
            let track = if g.next_u64().is_multiple_of(2) {
                1
            } else {
                1 + g.next_u64() % 6
            };
            let time = if i % 37 == 0 {
                "NULL".to_string()
            } else if i % 4 == 0 {
                // On the half-hour grid `time_text` draws from, where bounds fall.
                format!(
                    "'2024-03-{:02} {:02}:{}:00'",
                    10 + g.next_u64() % 3,
                    g.next_u64() % 24,
                    ["00", "30"][(g.next_u64() % 2) as usize]
                )
            } else {
                format!(
                    "'2024-03-{:02} {:02}:{:02}:{:02}'",
                    1 + g.next_u64() % 31,
                    g.next_u64() % 24,
                    g.next_u64() % 60,
                    g.next_u64() % 60
                )
            };
            let track = if i % 29 == 0 {
                "NULL".to_string()
            } else {
                track.to_string()
            };
            let user = if i % 5 == 0 {
                "NULL".to_string()
            } else {
                (g.next_u64() % 50).to_string()
            };
            let country = ["'US'", "'DE'", "'FR'", "NULL", "'BR'"][(g.next_u64() % 5) as usize];
            rows.push(format!("({time}, {track}, {user}, {country})"));
        }
        // The log's statistics are taken once and frozen (`STATS_AUTO_RECALC=0`): the
        // two databases then plan each read alike, so that the column flags of a
        // plan-dependent read (which heatsink takes from the server's plan) compare
        // equal; recalculated in the background, at different moments on the two
        // tables, they let the optimizer pick different indexes for the same read.
        // As production logs have them: a foreign key to the tracks (not cascading:
        // cascades bypass triggers and are refused), a CHECK constraint, and a
        // trigger of the application's own before heatsink's.
        format!(
            "CREATE TABLE tracks (id INT PRIMARY KEY);
             INSERT INTO tracks VALUES (1), (2), (3), (4), (5), (6);
             CREATE TABLE {LOG} (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at {} DEFAULT NULL, \
                 track_id INT DEFAULT NULL, user_id INT DEFAULT NULL, referer TEXT, \
                 country VARCHAR(20) DEFAULT NULL, KEY (track_id), KEY (created_at), \
                 CONSTRAINT plays_track FOREIGN KEY (track_id) REFERENCES tracks (id), \
                 CONSTRAINT plays_user CHECK (user_id IS NULL OR user_id BETWEEN 0 AND 1000000)) \
                 DEFAULT CHARSET=utf8mb4 STATS_PERSISTENT=1 STATS_AUTO_RECALC=0;
             CREATE TRIGGER {LOG}_no_empty BEFORE INSERT ON {LOG} FOR EACH ROW
                 SET NEW.country = NULLIF(NEW.country, '');
             INSERT INTO {LOG} (created_at, track_id, user_id, country) VALUES {};
             ANALYZE TABLE {LOG};",
            if self.utc {
                "TIMESTAMP NULL"
            } else {
                "DATETIME"
            },
            rows.join(", ")
        )
    }

    fn rule_toml(&self) -> String {
        format!(
            "[[rollup]]\nname = \"plays_by_hour\"\ntable = \"{LOG}\"\nrollup_table = \"plays_by_hour\"\n\
             time = \"created_at\"\nbucket = \"hour\"\ndimensions = [\"track_id\"]\n\n\
             [[rollup]]\nname = \"plays_by_country_day\"\ntable = \"{LOG}\"\n\
             rollup_table = \"plays_by_country_day\"\ntime = \"created_at\"\nbucket = \"day\"\n\
             dimensions = [\"track_id\", \"country\"]\nmeasures = [\"count(*)\", \"count(user_id)\", \"sum(user_id)\"]\n\n\
             [[rollup]]\nname = \"plays_by_country_hour\"\ntable = \"{LOG}\"\n\
             rollup_table = \"plays_by_country_hour\"\ntime = \"created_at\"\nbucket = \"hour\"\n\
             dimensions = [\"country\", \"track_id\"]\nmeasures = [\"count(*)\", \"count(user_id)\"]\n"
        )
    }

    fn state_query(&self) -> String {
        format!("SELECT id, created_at, track_id, user_id, country FROM {LOG} ORDER BY id")
    }

    fn physical_queries(&self) -> Vec<String> {
        vec![
            "SELECT track_id, hs_nulls, hs_bucket, SUM(hs_rows) FROM {db}.plays_by_hour \
             GROUP BY track_id, hs_nulls, hs_bucket HAVING SUM(hs_rows) <> 0"
                .into(),
            "SELECT country, track_id, hs_nulls, hs_bucket, SUM(hs_rows), SUM(hs_count_user_id) \
             FROM {db}.plays_by_country_hour GROUP BY country, track_id, hs_nulls, hs_bucket \
             HAVING SUM(hs_rows) <> 0"
                .into(),
        ]
    }

    /// A plain insert into the log (the shape that merges): a literal time or
    /// `NOW()`, sometimes a track that does not exist (1452 unless foreign_key_checks
    /// is off), a country latin1 spells differently, or one too long for its column
    /// (1406 when strict, cut with a warning otherwise).
    fn session_write(&self, g: &mut Gen, session: usize, k: usize) -> Option<Stmt> {
        let time = if g.chance(30) {
            "NOW()".to_string()
        } else {
            format!(
                "'2024-03-{:02} {:02}:{:02}:00'",
                1 + k % 28,
                k % 24,
                (k * 7) % 60
            )
        };
        let track = if g.chance(10) { 99 } else { 1 + g.below(6) };
        let country = *g.pick(&[
            "US",
            "DE",
            "Österreich",
            "Côte d'Ivoire",
            "United Kingdom of Great Britain",
        ]);
        let mut s = Stmt::new();
        s.sql(format!(
            "INSERT INTO {LOG} (created_at, track_id, user_id, country) VALUES ({time}, {track}, {session}, '"
        ))
        .sql(common::differential::encode(g, &country.replace('\'', "''")))
        .sql("')");
        s.write = true;
        s.text_only = true;
        Some(s)
    }

    /// On the DATETIME log, a trigger that stores the session's `@hs_tag` (when set)
    /// as the row's referer: it reads the connection, so the log's writes run alone
    /// (`rewrite::bound`) and a session's tag never lands in another's row. On the
    /// TIMESTAMP log, a trigger that reads only its row, so that writes merge.
    /// (The log's `track_id` must name a track: its foreign key.)
    fn session_schema(&self) -> String {
        if self.utc {
            format!(
                "CREATE TRIGGER {LOG}_tag BEFORE INSERT ON {LOG} FOR EACH ROW
                     SET NEW.referer = COALESCE(NEW.referer, CONCAT('track ', NEW.track_id))"
            )
        } else {
            format!(
                "CREATE TRIGGER {LOG}_tag BEFORE INSERT ON {LOG} FOR EACH ROW
                     SET NEW.referer = COALESCE(@hs_tag, NEW.referer)"
            )
        }
    }

    fn session_merges(&self) -> bool {
        self.utc
    }

    fn session_state_query(&self) -> String {
        format!(
            "SELECT track_id, user_id, country, referer, IF(created_at >= '2025-01-01', \
             CONCAT('now ', ROUND(TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), created_at) / 3600)), \
             created_at) FROM {LOG}"
        )
    }

    fn shadow_table(&self) -> Option<String> {
        Some(format!(
            "CREATE TEMPORARY TABLE {LOG} (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at DATETIME, \
             track_id INT, user_id INT, referer TEXT, country VARCHAR(20))"
        ))
    }

    fn statement(&self, g: &mut Gen) -> Stmt {
        let mut s = Stmt::new();
        match g.below(100) {
            0..=1 => {
                // The session's time zone: NOW() moves, DATETIME values do not.
                let tz = *g.pick(&["'+00:00'", "'+05:30'", "'Europe/Berlin'", "'SYSTEM'"]);
                s.sql(format!("SET time_zone = {tz}"));
                s.text_only = true;
            }
            2 if g.chance(50) => {
                // Zero dates: TRADITIONAL and NO_ZERO_DATE read and refuse them.
                // NO_ZERO_IN_DATE: a time series over zero-in-date rows.
                let mode = *g.pick(&[
                    "TRADITIONAL",
                    "NO_ZERO_DATE",
                    "NO_ZERO_IN_DATE",
                    "NO_ENGINE_SUBSTITUTION",
                ]);
                s.sql(format!("SET sql_mode = '{mode}'"));
                g.session.sql_mode = mode.to_string();
                s.text_only = true;
            }
            2..=14 => insert(g, &mut s),
            15..=19 => update(g, &mut s),
            20..=23 => delete(g, &mut s),
            24..=25 => insert_select(g, &mut s),
            _ => read(g, &mut s),
        }
        s
    }
}

/// A track: half of the time the hot one.
fn track_lit(g: &mut Gen) -> Lit {
    if g.chance(4) {
        return null();
    }
    let t = if g.chance(50) { 1 } else { g.range(1, 7) };
    g.int_lit(t)
}

fn null() -> Lit {
    Lit {
        text: "NULL".into(),
        param: Some(RawParam::Null),
    }
}

fn country_lit(g: &mut Gen) -> Lit {
    if g.chance(15) {
        return null();
    }
    let c = *g.pick(&["US", "DE", "FR", "BR", "JP"]);
    g.string_lit(c.as_bytes())
}

/// A time inside March 2024 (which ends with Europe/Berlin's change to summer time
/// on the 31st), ragged to the second or on a half-hour grid; sometimes in the night of 27 October 2024,
/// when Berlin's clocks go back from 03:00 to 02:00 (local times between are
/// ambiguous: a TIMESTAMP log's UTC buckets must still come out exact).
fn time_text(g: &mut Gen) -> String {
    // A quarter on a coarse grid, so that rows sit exactly on the bounds of ranges
    // and on the boundaries a read is split at.
    if g.chance(25) {
        return format!(
            "2024-03-{:02} {:02}:{}:00",
            g.range(10, 12),
            g.range(0, 23),
            g.pick(&["00", "30"])
        );
    }
    if g.chance(6) {
        return format!(
            "2024-10-{:02} {:02}:{:02}:{:02}",
            g.range(26, 28),
            g.range(0, 4),
            g.range(0, 59),
            g.range(0, 59)
        );
    }
    format!(
        "2024-03-{:02} {:02}:{:02}:{:02}",
        g.range(1, 31),
        g.range(0, 23),
        g.range(0, 59),
        g.range(0, 59)
    )
}

fn time_lit(g: &mut Gen) -> Lit {
    if g.chance(4) {
        return null();
    }
    if g.chance(3) {
        // A zero date: stored outside NO_ZERO_DATE, refused under TRADITIONAL.
        return g.string_lit(b"0000-00-00 00:00:00");
    }
    if g.chance(3) {
        // A zero day or month: stored outside NO_ZERO_IN_DATE.
        let t = *g.pick(&["2024-03-00 10:20:00", "2024-00-00 00:00:00"]);
        return g.string_lit(t.as_bytes());
    }
    let t = time_text(g);
    // A bucket boundary now and then.
    let t = if g.chance(20) {
        format!("{}:00:00", &t[..13])
    } else {
        t
    };
    g.string_lit(t.as_bytes())
}

fn insert(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    s.sql(format!(
        "INSERT INTO {LOG} (created_at, track_id, user_id, country) VALUES "
    ));
    let rows = if g.chance(30) { g.range(2, 5) } else { 1 };
    for r in 0..rows {
        if r > 0 {
            s.sql(", ");
        }
        s.sql("(")
            .lit(time_lit(g))
            .sql(", ")
            .lit(track_lit(g))
            .sql(", ");
        let user = if g.chance(20) {
            null()
        } else {
            let u = g.range(0, 49);
            g.int_lit(u)
        };
        s.lit(user).sql(", ").lit(country_lit(g)).sql(")");
    }
}

fn update(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    s.sql(format!("UPDATE {LOG} SET "));
    match g.below(3) {
        0 => s.sql("track_id = ").lit(track_lit(g)),
        1 => s.sql("created_at = ").lit(time_lit(g)),
        _ => s.sql("country = ").lit(country_lit(g)),
    };
    let id = g.range(1, 420);
    s.sql(" WHERE id = ").lit(g.int_lit(id));
}

fn delete(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    s.sql(format!("DELETE FROM {LOG} WHERE "));
    if g.chance(70) {
        let id = g.range(1, 420);
        s.sql("id = ").lit(g.int_lit(id));
    } else {
        s.sql("track_id = ")
            .lit(track_lit(g))
            .sql(" AND user_id < ");
        let u = g.range(0, 10);
        s.lit(g.int_lit(u));
    }
}

fn insert_select(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    s.text_only = true;
    let lo = g.range(1, 400);
    s.sql(format!(
        "INSERT INTO {LOG} (created_at, track_id, user_id, country) \
         SELECT created_at + INTERVAL 1 HOUR, track_id, user_id, country FROM {LOG} \
         WHERE id BETWEEN {lo} AND {}",
        lo + 3
    ));
}

/// A time predicate.
fn time_range(g: &mut Gen, s: &mut Stmt, t: &str) {
    // A bound: a string literal, sent as a string parameter or, now and then, as a
    // binary DATETIME parameter (prepared reads check the value at each execute).
    let lit = |g: &mut Gen| {
        let t = time_text(g);
        let mut l = g.string_lit(t.as_bytes());
        if g.chance(30) {
            l.param = Some(datetime_param(&t));
        }
        l
    };
    let pair = |g: &mut Gen| (lit(g), lit(g));
    if g.chance(8) {
        // Numbers and zero dates as bounds, and the top of the DATETIME range.
        let b = *g.pick(&[
            "0",
            "20240310",
            "'0000-00-00'",
            "'9999-12-31 23:59:59'",
            "'2024-02-30'",
        ]);
        match g.below(3) {
            0 => s.sql(format!("{t} >= {b}")),
            1 => s.sql(format!("{t} BETWEEN {b} AND NOW()")),
            _ => s.sql(format!("{t} BETWEEN '2024-03-10 10:30:00' AND {b}")),
        };
        return;
    }
    match g.below(7) {
        0 => {
            let (lo, hi) = pair(g);
            s.sql(format!("{t} BETWEEN ")).lit(lo).sql(" AND ").lit(hi);
        }
        1 => {
            s.sql(format!("{t} >= ")).lit(lit(g));
        }
        2 => {
            s.sql(format!("{t} < ")).lit(lit(g));
        }
        3 => {
            let (lo, hi) = pair(g);
            s.sql(format!("{t} > "))
                .lit(lo)
                .sql(format!(" AND {t} <= "))
                .lit(hi);
        }
        4 => {
            let l = lit(g);
            s.lit(l).sql(format!(" <= {t}"));
        }
        5 => {
            let days = g.range(1, 20);
            // Sometimes in a compound unit (`'d h:m' DAY_MINUTE`), read exactly.
            let interval = if g.chance(40) {
                let (h, m) = (g.range(0, 24), g.range(0, 60));
                format!("'{days} {h}:{m:02}' DAY_MINUTE")
            } else {
                format!("{days} DAY")
            };
            s.sql(format!(
                "{t} BETWEEN '2024-03-25 13:27:00' - INTERVAL {interval} AND '2024-03-25 13:27:00'"
            ));
        }
        _ => {
            // Relative to NOW(), in the session's time zone, landing in the data's
            // March 2024 with ragged hours.
            let (a, b) = (g.range(-24 * 14, 24 * 14), g.range(-24 * 14, 24 * 14));
            let ago = |h: i64| {
                format!("NOW() - INTERVAL (DATEDIFF(NOW(), '2024-03-15') * 24 + {h}) HOUR")
            };
            match g.below(3) {
                0 => s.sql(format!("{t} >= {}", ago(a))),
                1 => s.sql(format!("{t} < {}", ago(a))),
                _ => s.sql(format!(
                    "{t} BETWEEN {} AND {}",
                    ago(a.max(b)),
                    ago(a.min(b))
                )),
            };
        }
    }
}

/// The binary DATETIME parameter of a `YYYY-MM-DD HH:MM:SS` time.
fn datetime_param(t: &str) -> RawParam {
    let n = |r: std::ops::Range<usize>| -> u16 { t[r].parse().unwrap_or(0) };
    let mut value = vec![7u8];
    value.extend_from_slice(&n(0..4).to_le_bytes());
    for r in [5..7, 8..10, 11..13, 14..16, 17..19] {
        value.push(n(r) as u8);
    }
    RawParam::Typed {
        ty: 0x0c,
        unsigned: false,
        value,
    }
}

/// An aggregate read of the log.
fn read(g: &mut Gen, s: &mut Stmt) {
    // Now and then under a SET STATEMENT prefix: one the rewrite carries
    // (`time_zone`), or one whose statement runs as sent (`max_statement_time`).
    if g.chance(6) {
        s.sql(*g.pick(&[
            "SET STATEMENT time_zone = '+03:00' FOR ",
            "SET STATEMENT max_statement_time = 0 FOR ",
        ]));
        s.text_only = true;
    }
    let sel = g.kw("SELECT");
    let from = g.kw("FROM");
    s.order = Order::Exact;
    if g.chance(8) {
        fallback_read(g, s);
        return;
    }
    let alias = g.chance(30);
    let q = if alias { "p." } else { "" };
    let dims: &[&str] = match g.below(5) {
        0 => &[],
        1 | 2 => &["track_id"],
        3 => &["country"],
        _ => &["track_id", "country"],
    };
    let series = match g.below(7) {
        0 => Some(format!("DATE({q}created_at)")),
        1 => Some(format!("DATE_FORMAT({q}created_at, '%Y-%m-%d %H:00:00')")),
        2 => Some(format!("DATE_FORMAT({q}created_at, '%Y-%m')")),
        _ => None,
    };
    let mut items: Vec<String> = dims.iter().map(|d| format!("{q}{d}")).collect();
    if let Some(t) = &series {
        items.push(format!("{t} AS ts"));
    }
    // Unaliased sometimes: MariaDB names the column by its spelling.
    let unaliased = g.chance(20);
    if unaliased {
        items.push((*g.pick(&["COUNT(*)", "count( * )", "COUNT(\n  *)"])).into());
    } else {
        items.push("COUNT(*) AS n".into());
    }
    if dims.contains(&"country") || g.chance(20) {
        items.push(format!("COUNT({q}user_id) AS u"));
    }
    if g.chance(25) {
        items.push(format!("SUM({q}user_id) AS su"));
    }
    s.sql(format!("{sel} {} {from} {LOG}", items.join(", ")));
    if alias {
        s.sql(" p");
    }
    let fixed_track = g.chance(60);
    let ranged = g.chance(70);
    // Key, group and BINARY flags follow the plan MariaDB picks for the log's read
    // (index order or a temporary table): predicted where the shape settles it,
    // the server's own plan (`exact_flags`) where it does not, compared in full.
    // A dimension bound as a parameter makes the read fall back: both sides then
    // run it as sent, each planned on its own table (their statistics differ).
    s.param_flags_mask = GROUPED_FLAGS_BY_PLAN;
    let mut first = true;
    let mut and = |s: &mut Stmt| {
        s.sql(if first { " WHERE " } else { " AND " });
        first = false;
    };
    if fixed_track {
        and(s);
        if g.chance(5) {
            // A decimal key: MariaDB converts it as its plan decides.
            s.sql(format!("{q}track_id = {}", g.pick(&["2.4", "1.0", "'1'"])));
        } else {
            s.sql(format!("{q}track_id = ")).lit(track_lit(g));
        }
    }
    if g.chance(20) {
        and(s);
        s.sql(format!("{q}country IN ("))
            .lit(country_lit(g))
            .sql(", ")
            .lit(country_lit(g))
            .sql(")");
    }
    if g.chance(10) {
        and(s);
        s.sql(format!("{q}country IS NULL"));
    }
    if ranged {
        and(s);
        time_range(g, s, &format!("{q}created_at"));
    }
    let mut group: Vec<String> = dims.iter().map(|d| format!("{q}{d}")).collect();
    if series.is_some() {
        group.push(if g.chance(50) {
            "ts".into()
        } else {
            (group.len() + 1).to_string()
        });
    }
    if !group.is_empty() {
        s.sql(format!(" GROUP BY {}", group.join(", ")));
        if g.chance(25) && !unaliased {
            s.sql(" ORDER BY n DESC, ").sql(group.join(", "));
            if g.chance(50) {
                s.sql(format!(" LIMIT {}", g.range(1, 5)));
            }
        }
    }
}

/// Aggregate reads the rollups cannot answer: forwarded to the log.
fn fallback_read(g: &mut Gen, s: &mut Stmt) {
    let q = *g.pick(&[
        "SELECT COUNT(*) FROM plays WHERE track_id = 1",
        "SELECT count( * ), COUNT(user_id) FROM plays WHERE track_id = 2 AND created_at >= '2024-03-10'",
        "SELECT user_id, COUNT(*) AS n FROM plays GROUP BY user_id ORDER BY user_id",
        "SELECT track_id, SUM(user_id) AS s FROM plays GROUP BY track_id",
        "SELECT track_id, AVG(user_id) AS a FROM plays GROUP BY track_id",
        "SELECT COUNT(DISTINCT user_id) AS d FROM plays",
        "SELECT track_id, COUNT(*) AS n FROM plays GROUP BY track_id HAVING n > 10",
        "SELECT * FROM plays WHERE id = 3",
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE user_id > 10 GROUP BY track_id",
    ]);
    s.sql(q);
}
