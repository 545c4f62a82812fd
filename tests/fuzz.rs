//! Differential fuzzing of the rewrite rules (`tests/common/differential.rs`): seeded
//! statements of the shapes applications write against a counter (`hits`) and a ring
//! (`profile_visits_log`) — and shapes the rules must refuse — run through heatsink on
//! the ruled table and directly on a plain reference table, in both protocols, under
//! changing character sets and sql_modes. Every answer must be the reference's, or a
//! heatsink refusal (1105) that changed nothing.
//!
//! `HEATSINK_FUZZ_SEED`, `HEATSINK_FUZZ_STATEMENTS` replay or extend a run. Shapes of
//! fixed differences always run; `HEATSINK_FUZZ_ALL=1` adds the shapes of known open
//! differences (`KNOWN_OPEN`),
//! `HEATSINK_FUZZ_DOCUMENTED=1` those of documented limitations, `HEATSINK_FUZZ_TAGS`
//! single ones; `HEATSINK_FUZZ_VERBOSE=1` prints every statement. `scripts/fuzz.sh`
//! runs many seeds.

mod common;

use common::differential::{Charset, Differential, Gen, Kind, Lit, Order, Protocol, Stmt};
use common::fixture::Rule;
use common::packets::FLAGS_BY_PLAN;
use common::rawclient::RawParam;

/// Statements per round in the bounded run.
const STATEMENTS: usize = 1500;
/// Rounds per kind in the bounded run (see `common::differential::run_bounded`).
const ROUNDS: u64 = 3;
/// The bounded run's seed.
const SEED: u64 = 20_261_125;

fn run_kind(kind: &dyn Kind, seed_offset: u64) {
    common::differential::run_bounded(kind, SEED + seed_offset, STATEMENTS, ROUNDS);
}

#[test]
fn counter_matches_a_plain_table() {
    run_kind(&Counter, 0);
}

/// The counter through one proxy in front of a 3-node Galera cluster (its
/// connections spread over the nodes, each writing its node's share of the slots),
/// against a plain table on node 1.
#[test]
fn counter_matches_a_plain_table_on_a_galera_cluster() {
    common::differential::run_bounded_on(
        &Counter,
        SEED + 100,
        STATEMENTS,
        ROUNDS,
        common::differential::Target::Galera,
    );
}

#[test]
fn ring_matches_a_plain_table() {
    run_kind(&Ring, 1);
}

/// Concurrent sessions per side in the bounded session runs.
const SESSIONS: usize = 16;
/// Writes per session in the bounded session runs.
const SESSION_WRITES: usize = 12;
/// Rounds per kind in the bounded session runs.
const SESSION_ROUNDS: u64 = 2;

/// 16 concurrent sessions, about half of them after a state change from the catalogue
/// (`common::differential::STATE_CLASSES`), increment counters through heatsink (group
/// commit at its default) and directly: every answer and the counters must match.
#[test]
fn counter_sessions_match_direct() {
    common::differential::run_sessions_bounded(
        &Counter,
        SEED + 200,
        SESSIONS,
        SESSION_WRITES,
        SESSION_ROUNDS,
    );
}

/// The same for inserts into a ring, each session into its own key.
#[test]
fn ring_sessions_match_direct() {
    common::differential::run_sessions_bounded(
        &Ring,
        SEED + 201,
        SESSIONS,
        SESSION_WRITES,
        SESSION_ROUNDS,
    );
}

// ---------------------------------------------------------------------------------------
// Minimal reproductions of what the fuzzer found. Each failed until its difference was
// fixed (its tag is then off every list in `common::differential`, so the generator
// produces it by default); one pins a documented limitation and stays ignored.

fn assert_script(kind: &dyn Kind, script: &[(&str, Protocol)]) {
    let diff = Differential::start(kind);
    let report = diff.run_script(script);
    assert!(report.mismatches.is_empty(), "{}", report.details());
}

use Protocol::{Binary, Text};

#[test]
fn qualified_key_column_in_sets_and_deletes() {
    assert_script(
        &Counter,
        &[
            ("SET sql_mode = 'ANSI_QUOTES'", Text),
            ("DELETE FROM hits WHERE \"hits\".slug = 'tmp1'", Text),
            (
                "UPDATE hits SET cnt = 5 WHERE \"hits\".slug = 'home'",
                Binary,
            ),
        ],
    );
}

#[test]
fn hex_and_bit_literal_increments() {
    assert_script(
        &Counter,
        &[
            ("UPDATE hits SET cnt = cnt + 0x3 WHERE slug = 'home'", Text),
            ("UPDATE hits SET cnt = cnt - 100 WHERE slug = 'about'", Text),
            (
                "UPDATE hits SET cnt = cnt + b'1000' WHERE slug = 'about'",
                Text,
            ),
        ],
    );
}

#[test]
#[ignore = "known limitation (rules/README.md): an unsigned delta parameter on a negative counter is added where MariaDB fails with 1690"]
fn unsigned_increment_of_a_negative_counter() {
    let diff = Differential::start(&Counter);
    let report = diff.run_script_with_params(&[
        (
            "UPDATE hits SET cnt = -5 WHERE slug = 'about'",
            Text,
            vec![],
        ),
        (
            "UPDATE hits SET cnt = cnt + ? WHERE slug = 'about'",
            Binary,
            vec![RawParam::UInt(1)],
        ),
    ]);
    assert!(report.mismatches.is_empty(), "{}", report.details());
}

#[test]
fn low_priority_absolute_set() {
    assert_script(
        &Counter,
        &[
            ("UPDATE hits SET cnt = cnt + 5 WHERE slug = 'home'", Text),
            (
                "UPDATE LOW_PRIORITY hits SET cnt = 100 WHERE slug = 'home'",
                Text,
            ),
            ("SELECT cnt FROM hits WHERE slug = 'home'", Text),
        ],
    );
}

#[test]
fn table_name_qualifier_behind_an_alias() {
    assert_script(
        &Counter,
        &[(
            "UPDATE hits AS h SET hits.cnt = hits.cnt + 1 WHERE slug = 'home'",
            Text,
        )],
    );
}

#[test]
fn placeholder_in_a_text_statement() {
    assert_script(
        &Counter,
        &[("UPDATE hits SET cnt = cnt + ? WHERE slug = 'home'", Text)],
    );
}

#[test]
fn ring_insert_after_a_partial_delete() {
    assert_script(
        &Ring,
        &[
            ("DELETE FROM profile_visits_log WHERE id = 5", Text),
            (
                "INSERT INTO profile_visits_log (uid, visitor_uid, last_update) VALUES (1, 9, '2024-05-01')",
                Text,
            ),
        ],
    );
}

#[test]
fn ring_insert_ignore_in_strict_mode() {
    assert_script(
        &Ring,
        &[(
            "INSERT IGNORE INTO profile_visits_log (uid, visitor_uid, last_update) VALUES (1, 1, '2024-02-30')",
            Text,
        )],
    );
}

#[test]
fn ring_update_error_names_the_log() {
    assert_script(
        &Ring,
        &[(
            "UPDATE profile_visits_log SET visitor_uid = 'abc' WHERE uid = 1",
            Text,
        )],
    );
}

#[test]
fn ring_insert_with_a_null_key_and_a_bad_date() {
    assert_script(
        &Ring,
        &[(
            "INSERT INTO profile_visits_log (uid, visitor_uid, last_update) VALUES (NULL, 1, '2024-02-30')",
            Text,
        )],
    );
}

#[test]
fn comment_for_a_newer_server_version() {
    assert_script(
        &Counter,
        &[(
            "UPDATE hits SET cnt = 50 WHERE slug = 'home' /*!999999 AND 1 = 0 */",
            Text,
        )],
    );
    assert_script(
        &Counter,
        &[(
            "DELETE FROM hits WHERE slug = 'tmp1' /*!999999 AND 1 = 0 */",
            Text,
        )],
    );
    assert_script(
        &Counter,
        &[(
            "SELECT cnt FROM hits WHERE slug = 'blog' /*!999999 AND 1 = 0 */",
            Text,
        )],
    );
}

#[test]
#[ignore = "known limitation (rules/README.md): expressions over the counter table's columns lack some column flags"]
fn aggregate_of_the_key_keeps_its_flags() {
    assert_script(
        &Counter,
        &[
            (
                "SELECT note, COUNT(*), MIN(slug) FROM hits GROUP BY note ORDER BY note",
                Text,
            ),
            ("SELECT MIN(slug) FROM hits", Binary),
        ],
    );
}

#[test]
fn ring_insert_returning() {
    assert_script(
        &Ring,
        &[(
            "INSERT INTO profile_visits_log (uid, visitor_uid, last_update) VALUES (1, 1, '2024-01-01') RETURNING id",
            Text,
        )],
    );
}

// ---------------------------------------------------------------------------------------
// Keys in every character set

/// A string key: its bytes in each client character set (`None`: not representable).
struct Key {
    utf8mb4: &'static [u8],
    latin1: Option<&'static [u8]>,
    gbk: Option<&'static [u8]>,
    sjis: Option<&'static [u8]>,
    /// Contains a character whose second byte is 0x5C in gbk or sjis.
    has_5c: bool,
}

impl Key {
    const fn ascii(s: &'static str) -> Key {
        let b = s.as_bytes();
        Key {
            utf8mb4: b,
            latin1: Some(b),
            gbk: Some(b),
            sjis: Some(b),
            has_5c: false,
        }
    }

    fn bytes(&self, cs: Charset) -> Option<&'static [u8]> {
        match cs {
            Charset::Utf8mb4 => Some(self.utf8mb4),
            Charset::Latin1 => self.latin1,
            Charset::Gbk => self.gbk,
            Charset::Sjis => self.sjis,
        }
    }
}

/// A key from `pool` as bytes of the session's character set (ASCII keys always work).
fn key_bytes(g: &mut Gen, pool: &[Key]) -> Vec<u8> {
    for _ in 0..8 {
        let k = g.pick(pool);
        if let Some(b) = k.bytes(g.session.charset) {
            let multibyte_5c =
                k.has_5c && matches!(g.session.charset, Charset::Gbk | Charset::Sjis);
            if multibyte_5c && !g.open("charset_5c") {
                continue;
            }
            if b.contains(&b'\\') && g.session.no_backslash_escapes() && !g.open("nbe_backslash") {
                continue;
            }
            return b.to_vec();
        }
    }
    pool[0].utf8mb4.to_vec()
}

// ---------------------------------------------------------------------------------------
// Counter

/// Keys of the first rows; never deleted, so increments of them never create a key.
const STABLE: &[Key] = &[
    Key::ascii("home"),
    Key::ascii("about"),
    Key::ascii("blog"),
    Key {
        utf8mb4: "中文".as_bytes(),
        latin1: None,
        gbk: Some(b"\xd6\xd0\xce\xc4"),
        sjis: Some(b"\x92\x86\x95\xb6"),
        has_5c: false,
    },
    Key {
        utf8mb4: "café".as_bytes(),
        latin1: Some(b"caf\xe9"),
        gbk: Some(b"caf\xa8\xa6"),
        sjis: None,
        has_5c: false,
    },
];

/// Keys whose row the table refuses (a CHECK on the key): never there, so an
/// increment of one creates no row, matches none and changes nothing.
const REFUSED: &[Key] = &[Key::ascii("banned"), Key::ascii("banned o'x")];

/// Keys that come and go (inserted, deleted, set).
const VOLATILE: &[Key] = &[
    Key::ascii("tmp1"),
    Key::ascii("tmp2"),
    Key::ascii("tmp3"),
    Key::ascii("tmp o'brien"),
    Key::ascii("tmp back\\slash"),
    Key::ascii("tmp%_"),
    Key {
        utf8mb4: "tmp縗".as_bytes(),
        latin1: None,
        gbk: Some(b"tmp\xbf\x5c"),
        sjis: None,
        has_5c: true,
    },
    Key {
        utf8mb4: "tmpソ表".as_bytes(),
        latin1: None,
        gbk: Some(b"tmp\xa5\xbd\xb1\xed"),
        sjis: Some(b"tmp\x83\x5c\x95\x5c"),
        has_5c: true,
    },
];

struct Counter;

const HITS: &str = "hits";

impl Kind for Counter {
    fn name(&self) -> &'static str {
        "counter"
    }

    fn schema(&self) -> String {
        "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0, \
             note VARCHAR(20), UNIQUE KEY hits_note_u (note)) DEFAULT CHARSET=utf8mb4;
         CREATE TABLE pages (slug VARCHAR(64) PRIMARY KEY, title VARCHAR(100) NOT NULL) \
             DEFAULT CHARSET=utf8mb4;
         INSERT INTO hits VALUES ('home', 10, 'front'), ('about', 3, NULL), ('blog', 7, 'b'),
             ('中文', 1, 'zh'), ('café', 0, NULL), ('tmp1', 5, NULL);
         INSERT INTO pages VALUES ('home', 'Home'), ('blog', 'Blog'), ('contact', 'Contact'),
             ('tmp1', 'Temp');
         ALTER TABLE hits ADD CONSTRAINT hits_note CHECK (note IS NULL OR note <> 'forbidden'),
             ADD CONSTRAINT hits_banned CHECK (slug NOT LIKE 'banned%');
         CREATE TABLE hit_notes (slug VARCHAR(64) NOT NULL, body VARCHAR(20), \
             FOREIGN KEY (slug) REFERENCES hits (slug) ON DELETE RESTRICT ON UPDATE CASCADE) \
             DEFAULT CHARSET=utf8mb4;
         INSERT INTO hit_notes VALUES ('home', 'pinned'), ('tmp1', 'held');"
            .into()
    }

    fn rule_toml(&self) -> String {
        common::fixture::counter_rule("page_hits")
    }

    fn state_query(&self) -> String {
        "SELECT slug, cnt, note FROM hits ORDER BY slug".into()
    }

    fn physical_queries(&self) -> Vec<String> {
        vec![
            "SELECT slug, HEX(slug), cnt FROM {db}.hits ORDER BY slug".into(),
            "SELECT slug, HEX(slug), slot, cnt FROM {db}.hits_slots ORDER BY slug, slot".into(),
        ]
    }

    /// An increment of a key latin1 can also spell (increments commute, so the order
    /// of the sessions does not matter).
    fn session_write(&self, g: &mut Gen, _session: usize, _k: usize) -> Option<Stmt> {
        let key = *g.pick(&["home", "about", "blog", "café", "tmp1"]);
        let d = *g.pick(&[1, 1, 2, 3, -1, 5]);
        let mut s = Stmt::new();
        s.sql(format!("UPDATE hits SET cnt = cnt + {d} WHERE slug = '"))
            .sql(common::differential::encode(g, key))
            .sql("'");
        s.write = true;
        s.text_only = true;
        Some(s)
    }

    fn statement(&self, g: &mut Gen) -> Stmt {
        let mut s = Stmt::new();
        match g.below(100) {
            0..=29 => counter_increment(g, &mut s),
            30..=36 => counter_set(g, &mut s),
            37..=40 => counter_note(g, &mut s),
            41..=52 => counter_insert(g, &mut s),
            53..=58 => counter_delete(g, &mut s),
            59..=93 => counter_select(g, &mut s),
            // Rewrites run inside the client's transaction: ROLLBACK must undo them.
            // (Only for the counter: the ring's reference is trimmed from another
            // connection, which would wait for the session's row locks.)
            94 | 95 => {
                s.write = true;
                s.text_only = g.chance(50);
                s.sql(*g.pick(&[
                    "BEGIN",
                    "START TRANSACTION",
                    "COMMIT",
                    "ROLLBACK",
                    "rollback",
                    "SAVEPOINT sp",
                    "ROLLBACK TO SAVEPOINT sp",
                    "SET autocommit = 0",
                    "SET autocommit = 1",
                ]));
            }
            96 => {
                // Two statements in one COM_QUERY (multi-statements are on).
                s.text_only = true;
                if g.chance(50) {
                    s.sql("SELECT 1; ");
                    counter_increment(g, &mut s);
                } else {
                    counter_increment(g, &mut s);
                    s.sql("; SELECT slug, cnt FROM hits ORDER BY slug");
                }
            }
            _ => {
                counter_increment(g, &mut s);
                malformed(g, &mut s);
            }
        }
        // `slug = 0` compares every key as a number: in a strict mode each
        // non-numeric key fails the write, and the first one visited is named.
        if s.write && g.used("numeric_key") {
            s.first_error_by_plan = true;
        }
        s
    }
}

/// A key literal of `pool`, sometimes in another letter case or with trailing spaces
/// (the same key for the column's collation), or a tagged odd type.
fn key_lit(g: &mut Gen, pool: &[Key]) -> Lit {
    // A number compared with the string key matches every non-numeric key in
    // non-strict mode: not where rows are deleted (the VOLATILE pool), which would
    // take the stable keys with it.
    if !std::ptr::eq(pool, VOLATILE) && g.maybe(3, "numeric_key") {
        let (t, v) = *g.pick(&[("0", 0), ("1e0", 1), ("TRUE", 1), ("5", 5), ("0.0", 0)]);
        return Lit {
            text: t.into(),
            param: Some(RawParam::Int(v)),
        };
    }
    if g.maybe(2, "null_key") {
        return Lit {
            text: "NULL".into(),
            param: Some(RawParam::Null),
        };
    }
    // Literals whose end depends on the session: a multi-byte character ending in
    // 0x5C before the quote (gbk, sjis), a backslash before the quote
    // (NO_BACKSLASH_ESCAPES). MariaDB reads `'…' OR 1=1 -- '` as a string and SQL.
    // Their `OR 1=1` matches every row: not where rows are deleted either.
    let deleting = std::ptr::eq(pool, VOLATILE);
    let cs = g.session.charset;
    if !deleting && matches!(cs, Charset::Gbk | Charset::Sjis) && g.maybe(3, "charset_5c") {
        let lead: &[u8] = if cs == Charset::Gbk { b"\xbf" } else { b"\x83" };
        let mut t = b"'tmp".to_vec();
        t.extend_from_slice(lead);
        t.extend_from_slice(b"\\' OR 1=1 -- '");
        return Lit::plain(t);
    }
    if !deleting && g.session.no_backslash_escapes() && g.maybe(3, "nbe_backslash") {
        return Lit::plain(&b"'tmp\\' OR 1=1 -- '"[..]);
    }
    // Invalid in utf8mb4 (in latin1 it is a valid key the table does not have).
    if g.session.charset == Charset::Utf8mb4 && g.maybe(2, "invalid_bytes") {
        return g.string_lit(b"tmp\xff\xfe");
    }
    let mut k = key_bytes(g, pool);
    match g.below(20) {
        0 => k.make_ascii_uppercase(),
        1 => k.extend_from_slice(b"  "),
        _ => {}
    }
    g.string_lit(&k)
}

/// `WHERE`-condition on the key.
fn key_cond(g: &mut Gen, s: &mut Stmt, pool: &[Key]) {
    let col = if g.maybe(12, "found_qualified_key") {
        let q = g.ident(HITS);
        let n = g.ident("slug");
        format!("{q}.{n}")
    } else {
        g.ident("slug")
    };
    let eq = if g.chance(5) { "<=>" } else { "=" };
    let ws = g.ws();
    match g.below(20) {
        0 => {
            let k = key_lit(g, pool);
            s.lit(k).sql(format!(" {eq} {col}"));
        }
        1 => {
            let k = key_lit(g, pool);
            s.sql(format!("{col} IN ("));
            s.lit(k).sql(")");
        }
        2 => {
            let (a, b) = (key_lit(g, pool), key_lit(g, pool));
            s.sql(format!("{col} IN ("));
            s.lit(a).sql(", ").lit(b).sql(")");
        }
        3 => {
            let k = key_lit(g, pool);
            s.sql(format!("({col}{ws}{eq}{ws}"));
            s.lit(k).sql(")");
        }
        4 => {
            // An extra condition on another column.
            let k = key_lit(g, pool);
            s.sql(format!("{col} {eq} "));
            s.lit(k).sql(" AND note IS NOT NULL");
        }
        5 => {
            let k = key_lit(g, pool);
            s.sql(format!("{col} {eq} "));
            s.lit(k).sql(*g.pick(&[
                " AND 1 = 1",
                " OR 1 = 0",
                " AND slug = slug",
                " AND TRUE",
                " AND cnt = cnt",
            ]));
        }
        // Expressions naming stable keys (never in a DELETE, whose pool is VOLATILE).
        7 if std::ptr::eq(pool, STABLE) => {
            let k = *g.pick(&[
                "CONCAT('ho', 'me')",
                "LOWER('BLOG')",
                "(SELECT 'about')",
                "@nokey",
            ]);
            s.sql(format!("{col} {eq} {k}"));
        }
        6 => {
            // Executable comments: MariaDB runs `/*! … */` and `/*M!100000 … */`, and
            // skips `/*!999999 … */` (a version above its own).
            let k = key_lit(g, pool);
            s.sql(format!("{col} {eq} "));
            s.lit(k);
            s.sql(*g.pick(&[
                " /*! AND 1 = 0 */",
                " /*!100000 AND 1 = 0 */",
                " /*M!100000 AND 1 = 0 */",
                " /*! AND 1 = 1 */",
            ]));
            if g.maybe(30, "found_versioned_comment") {
                s.sql(" /*!999999 AND 1 = 0 */");
            }
        }
        _ => {
            let k = key_lit(g, pool);
            s.sql(format!("{col}{ws}{eq}{ws}"));
            s.lit(k);
        }
    }
}

/// An increment's delta: mostly small, never 0 (a documented difference).
fn delta(g: &mut Gen) -> Lit {
    if g.maybe(2, "null_delta") {
        return Lit {
            text: "NULL".into(),
            param: Some(RawParam::Null),
        };
    }
    if g.maybe(2, "doc_zero_increment") {
        return g.int_lit(0);
    }
    if g.maybe(2, "doc_int_range") {
        return g.int_lit(2_147_483_647);
    }
    if g.maybe(3, "found_hex_literal") {
        let v = g.range(1, 9);
        return Lit::plain(format!("0x{v:X}"));
    }
    if g.maybe(2, "doc_nonnumeric_delta") {
        let v = *g.pick(&[&b"x"[..], b"5x", b""]);
        return g.string_lit(v);
    }
    let v = if g.chance(10) {
        g.range(100, 1000)
    } else {
        g.range(1, 9)
    };
    g.int_lit(v)
}

/// `UPDATE [LOW_PRIORITY] hits [AS h] SET `; returns the name that qualifies its
/// columns (the alias, if any).
fn update_head(g: &mut Gen, s: &mut Stmt) -> &'static str {
    let update = g.kw("UPDATE");
    s.sql(update).sql(" ");
    if g.maybe(5, "found_low_priority") {
        let m = g.kw("LOW_PRIORITY");
        s.sql(m).sql(" ");
    }
    g.table(s, HITS);
    let mut qualifier = HITS;
    if g.chance(5) {
        s.sql(" AS h");
        // The table's own name no longer qualifies its columns (1054 for MariaDB).
        if !g.maybe(30, "found_alias_qualifier") {
            qualifier = "h";
        }
    }
    let set = g.kw("SET");
    let ws = g.ws();
    s.sql(format!("{ws}{set} "));
    qualifier
}

/// `ORDER BY` / `LIMIT` / `RETURNING` tails of UPDATE and DELETE.
fn write_tail(g: &mut Gen, s: &mut Stmt) {
    if g.chance(8) {
        let o = g.kw("ORDER BY");
        s.sql(format!(" {o} slug"));
    }
    if g.chance(15) {
        let l = g.kw("LIMIT");
        s.sql(format!(" {l} "));
        if g.maybe(20, "limit0") {
            let z = g.int_lit(0);
            s.lit(Lit::plain(z.text));
        } else {
            let n = *g.pick(&[1, 1, 2, 10]);
            s.lit(Lit {
                text: n.to_string().into_bytes(),
                param: Some(RawParam::Int(n)),
            });
        }
    }
    if g.maybe(3, "returning") {
        s.sql(" RETURNING cnt");
    }
    if g.chance(5) {
        s.sql(*g.pick(&[";", " ;", " -- end", " /* end */", "\n"]));
    }
}

fn counter_increment(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    let q = update_head(g, s);
    let col = g.column(q, "cnt");
    let ws = g.ws();
    match g.below(30) {
        0..=2 => {
            let d = delta(g);
            s.sql(format!("{col}{ws}={ws}"));
            s.lit(d).sql(format!(" + {col}"));
        }
        3..=5 => {
            let d = delta(g);
            s.sql(format!("{col} = {col} -{ws}"));
            s.lit(d);
        }
        6 => {
            let d = delta(g);
            s.sql(format!("{col}={col}+"));
            s.lit(d);
        }
        7 => {
            // Shapes the rule must refuse (or get exactly right).
            let bad = *g.pick(&[
                "cnt = cnt * 2",
                "cnt = cnt + cnt",
                "cnt = cnt + LENGTH(slug)",
                "cnt = cnt + (SELECT 1)",
                "cnt = cnt + @nothing",
                "cnt = (cnt + 1)",
                "cnt = cnt + 1 + 1",
                "cnt = -cnt",
                "cnt = cnt + 1, note = 'n'",
                "note = 'n', cnt = cnt + 1",
            ]);
            s.sql(bad);
        }
        8 if g.open("found_text_placeholder") => {
            s.text_only = true;
            s.sql(format!("{col} = {col} + ?"));
        }
        9 if g.open("double_assign") => {
            s.sql(format!("{col} = {col} + 1, {col} = {col} + 1"));
        }
        _ => {
            let d = delta(g);
            s.sql(format!("{col}{ws}={ws}{col}{ws}+{ws}"));
            s.lit(d);
        }
    }
    let w = g.kw("WHERE");
    s.sql(format!(" {w} "));
    let pool = if g.chance(5) && g.open("doc_missing_key") {
        VOLATILE
    } else if g.chance(8) {
        REFUSED
    } else {
        STABLE
    };
    if g.chance(3) {
        // A condition on the counter itself: refused, or exact.
        s.sql("cnt > 5 AND ");
    }
    key_cond(g, s, pool);
    write_tail(g, s);
}

fn counter_set(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    let q = update_head(g, s);
    let col = g.column(q, "cnt");
    let v = match g.below(20) {
        0 => -g.range(1, 1000),
        // Small values: the base row may already hold it while the counter does not.
        2 | 3 if g.open("doc_absolute_set") => g.range(0, 12),
        // Clamped to the INT maximum outside strict mode; increments would then
        // overflow (a documented difference).
        1 if g.open("doc_int_range") => 3_000_000_000,
        _ => g.range(1000, 1_000_000),
    };
    let l = g.int_lit(v);
    s.sql(format!("{col} = "));
    s.lit(l);
    let w = g.kw("WHERE");
    s.sql(format!(" {w} "));
    let pool = if g.chance(50) { STABLE } else { VOLATILE };
    key_cond(g, s, pool);
    write_tail(g, s);
}

/// Short notes, sometimes longer than the column (20 characters).
fn note_lit(g: &mut Gen) -> Lit {
    if g.chance(10) {
        return Lit {
            text: "NULL".into(),
            param: Some(RawParam::Null),
        };
    }
    let v: &[u8] = g.pick::<&[u8]>(&[
        &b"n"[..],
        b"a longer note than twenty",
        b"it's",
        b"",
        b"x\"y",
        b"forbidden",
    ]);
    g.string_lit(v)
}

fn counter_note(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    let q = update_head(g, s);
    let col = g.column(q, "note");
    let n = note_lit(g);
    s.sql(format!("{col} = "));
    s.lit(n);
    let w = g.kw("WHERE");
    s.sql(format!(" {w} "));
    let pool = if g.chance(50) { STABLE } else { VOLATILE };
    key_cond(g, s, pool);
    write_tail(g, s);
}

fn counter_insert(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    let ins = g.kw("INSERT");
    let into = g.kw("INTO");
    match g.below(10) {
        // A new counter (or a duplicate key error).
        0..=3 => {
            let ignore = if g.chance(15) { " IGNORE" } else { "" };
            s.sql(format!("{ins}{ignore} {into} "));
            g.table(s, HITS);
            let rows = if g.chance(20) { 2 } else { 1 };
            let with_note = g.chance(40);
            if with_note {
                s.sql(" (slug, cnt, note) VALUES ");
            } else {
                s.sql(" (slug, cnt) VALUES ");
            }
            for i in 0..rows {
                if i > 0 {
                    s.sql(", ");
                }
                let k = key_lit(g, VOLATILE);
                let v = g.range(0, 50);
                let v = g.int_lit(v);
                s.sql("(").lit(k).sql(", ").lit(v);
                if with_note {
                    let n = note_lit(g);
                    s.sql(", ").lit(n);
                }
                s.sql(")");
            }
        }
        4 => {
            s.sql(format!("{ins} {into} "));
            g.table(s, HITS);
            let k = key_lit(g, VOLATILE);
            let v = g.int_lit(1);
            s.sql(" SET slug = ").lit(k).sql(", cnt = ").lit(v);
        }
        // The upsert form of an increment.
        5..=8 => {
            s.sql(format!("{ins} {into} "));
            g.table(s, HITS);
            let pool = if g.chance(50) { STABLE } else { VOLATILE };
            let k = key_lit(g, pool);
            let d = delta(g);
            // With a note: the table may refuse the row (its CHECK), convert it (too
            // long) or match it on the note's unique key instead of the slug.
            let note = g.chance(40).then(|| note_lit(g));
            let columns = match note {
                Some(_) => " (slug, cnt, note) VALUES (",
                None => " (slug, cnt) VALUES (",
            };
            s.sql(columns).lit(k).sql(", ").lit(d.clone());
            if let Some(n) = note {
                s.sql(", ").lit(n);
            }
            let odku = g.kw("ON DUPLICATE KEY UPDATE");
            s.sql(format!(") {odku} "));
            match g.below(4) {
                0 => {
                    s.sql("cnt = cnt + VALUES(cnt)");
                }
                1 => {
                    s.sql("cnt = cnt * 2");
                }
                _ => {
                    s.sql("cnt = cnt + ").lit(d);
                }
            }
        }
        _ => {
            let rep = g.kw("REPLACE");
            s.sql(format!("{rep} {into} "));
            g.table(s, HITS);
            let k = key_lit(g, VOLATILE);
            s.sql(" (slug, cnt) VALUES (").lit(k).sql(", 1)");
        }
    }
}

fn counter_delete(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    let del = g.kw("DELETE");
    let from = g.kw("FROM");
    s.sql(format!("{del} {from} "));
    g.table(s, HITS);
    let w = g.kw("WHERE");
    s.sql(format!(" {w} "));
    match g.below(10) {
        0 => {
            s.sql("slug LIKE 'tmp%'");
        }
        1 => {
            s.sql("cnt > 5 AND slug LIKE 'tmp%'");
        }
        _ => key_cond(g, s, VOLATILE),
    }
    write_tail(g, s);
}

fn counter_select(g: &mut Gen, s: &mut Stmt) {
    let sel = g.kw("SELECT");
    let from = g.kw("FROM");
    s.order = Order::Unordered;
    match g.below(12) {
        0 => {
            s.sql(format!("{sel} h.slug, h.cnt, p.title {from} "));
            g.table(s, HITS);
            s.sql(" h JOIN pages p ON p.slug = h.slug ORDER BY h.slug");
            s.order = Order::Exact;
            s.flags_mask = FLAGS_BY_PLAN;
            return;
        }
        1 => {
            s.sql(format!(
                "{sel} title {from} pages WHERE slug IN (SELECT slug FROM hits WHERE cnt > 5) ORDER BY title"
            ));
            s.order = Order::Exact;
            return;
        }
        2 => {
            s.sql(format!("{sel} COUNT(*) {from} "));
            g.table(s, HITS);
            return;
        }
        3 => {
            // Other read shapes naming the table.
            let q = *g.pick(&[
                "SELECT slug, cnt FROM hits WHERE slug = 'home' UNION ALL SELECT slug, cnt FROM hits WHERE slug = 'blog' ORDER BY slug",
                "SELECT x.slug, x.cnt FROM (SELECT slug, cnt FROM hits) AS x ORDER BY x.slug",
                "SELECT title FROM pages p WHERE EXISTS (SELECT 1 FROM hits h WHERE h.slug = p.slug AND h.cnt > 3) ORDER BY title",
                "SELECT note, COUNT(*), MIN(slug) FROM hits GROUP BY note ORDER BY note",
                "SELECT slug FROM hits WHERE cnt = (SELECT MAX(cnt) FROM hits) ORDER BY slug",
                "SELECT slug, cnt FROM hits WHERE slug = CONCAT('ho', 'me')",
                "SELECT SQL_CALC_FOUND_ROWS slug, cnt FROM hits ORDER BY slug LIMIT 2",
                "SELECT DISTINCT cnt > 5 AS big FROM hits ORDER BY big",
                "SELECT slug, cnt FROM hits WHERE slug BETWEEN 'a' AND 'c' ORDER BY slug",
                "SELECT slug, cnt FROM hits WHERE slug IN (SELECT slug FROM pages) ORDER BY slug",
                "SELECT h1.slug, h2.cnt FROM hits h1 JOIN hits h2 ON h1.slug = h2.slug ORDER BY h1.slug",
                "SELECT slug, cnt FROM hits WHERE slug = 'home' FOR UPDATE",
                "SELECT cnt INTO @c FROM hits WHERE slug = 'home'",
                "SELECT @c",
                "EXPLAIN SELECT cnt FROM hits WHERE slug = 'home'",
                "SHOW COLUMNS FROM hits",
                "SELECT slug, cnt FROM hits ORDER BY slug LIMIT 1, 2",
                "SELECT (SELECT cnt FROM hits WHERE slug = 'blog') AS b",
            ]);
            // The counter through UNION, a derived table or a scalar subquery is
            // typed from the rewrite's BIGINT (documented); an aggregate of the key
            // loses a column flag (found here).
            let gated = if q.contains("UNION") || q.contains("AS x") || q.contains("AS b") {
                !g.open("doc_counter_expr")
            } else if q.contains("MIN(slug)") {
                !g.open("found_read_metadata")
            } else {
                false
            };
            // EXPLAIN shows the rewritten plan: not comparable.
            if q.starts_with("EXPLAIN") || gated {
                s.sql("SELECT 1");
                return;
            }
            s.sql(q);
            // A join, or a semi-join of the key (`slug IN (SELECT …)`), may be
            // planned through a temporary table on one side only.
            if q.contains(" JOIN ") || q.contains("slug IN (SELECT") {
                s.flags_mask = FLAGS_BY_PLAN;
            }
            s.order = if q.contains("ORDER BY") {
                Order::Exact
            } else {
                Order::Unordered
            };
            return;
        }
        _ => {}
    }
    let cols = if g.maybe(5, "doc_counter_expr") {
        *g.pick(&["cnt + 1", "MAX(cnt)", "SUM(cnt)", "IFNULL(cnt, 0)"])
    } else {
        *g.pick(&[
            "*",
            "slug, cnt",
            "cnt",
            "cnt AS c",
            "cnt c, slug",
            "slug, note",
            "`cnt`, `slug`",
            "hits.cnt",
            "slug, cnt, note, cnt AS again",
        ])
    };
    s.sql(format!("{sel} {cols} {from} "));
    g.table(s, HITS);
    match g.below(10) {
        0..=4 => {
            let w = g.kw("WHERE");
            s.sql(format!(" {w} "));
            let pool = if g.chance(70) { STABLE } else { VOLATILE };
            key_cond(g, s, pool);
        }
        5 => {
            s.sql(" WHERE cnt > ");
            let v = g.range(0, 20);
            let l = g.int_lit(v);
            s.lit(l);
        }
        6 => {
            s.sql(" WHERE slug LIKE 'b%' OR note IS NULL");
        }
        _ => {}
    }
    if cols.contains("MAX") || cols.contains("SUM") {
        return;
    }
    if (cols.contains("slug") || cols == "*") && g.chance(40) {
        let o = g.kw("ORDER BY");
        s.sql(format!(" {o} "));
        // `ORDER BY 1` is a total order only when the first column is the key.
        let first_is_key = cols.starts_with("slug") || cols == "*";
        let orders: &[&str] = if first_is_key {
            &["slug", "slug DESC", "cnt DESC, slug", "1"]
        } else {
            &["slug", "slug DESC", "cnt DESC, slug"]
        };
        s.sql(*g.pick(orders));
        s.order = Order::Exact;
        if g.chance(30) {
            let l = g.kw("LIMIT");
            let n = g.range(0, 4);
            s.sql(format!(" {l} "));
            s.lit(Lit {
                text: n.to_string().into_bytes(),
                param: Some(RawParam::Int(n)),
            });
            if g.chance(30) {
                s.sql(" OFFSET 1");
            }
        }
    }
    if g.chance(4) {
        s.sql(*g.pick(&[" FOR UPDATE", " LOCK IN SHARE MODE"]));
    }
}

/// Cuts the statement short, or adds a stray token: mostly syntax errors.
fn malformed(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    if g.chance(50) {
        // Keep a prefix of the pieces (literals as text), cut inside the last one.
        let keep = 1 + g.below(s.pieces.len().max(1));
        s.pieces.truncate(keep);
        let cut = g.below(64);
        if let Some(last) = s.pieces.last_mut() {
            use common::differential::Piece;
            if let Piece::Sql(b) = last {
                let at = cut.min(b.len());
                b.truncate(at);
            } else if let Piece::Lit(l) = last {
                let at = cut.min(l.text.len());
                let mut t = l.text.clone();
                t.truncate(at);
                *last = Piece::Sql(t);
            }
        }
        // A cut can leave a complete statement (`UPDATE hits SET cnt = 7`): end it
        // with a stray comma after a newline (which also ends a `--` comment).
        s.sql("\n ,");
    } else {
        s.sql(*g.pick(&[
            " ,", " WHERE", " )", " 'open", " \"", " `x", " /* open", " AND",
        ]));
    }
}

// ---------------------------------------------------------------------------------------
// Ring

/// Rows kept per key.
const RING_SIZE: usize = 3;
const LOG: &str = "profile_visits_log";

struct Ring;

impl Kind for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn schema(&self) -> String {
        format!(
            "CREATE TABLE users (uid INT PRIMARY KEY, name VARCHAR(20) NOT NULL);
             INSERT INTO users VALUES (1, 'ann'), (2, 'bob'), (3, 'cy'), (4, 'di');
             CREATE TABLE {LOG} (id INT AUTO_INCREMENT PRIMARY KEY, uid INT NOT NULL, \
                 visitor_uid INT NOT NULL, last_update DATETIME(6) NOT NULL, KEY(uid), \
                 CONSTRAINT visits_user FOREIGN KEY (uid) REFERENCES users (uid), \
                 CONSTRAINT visits_visitor CHECK (visitor_uid <> 666));
             CREATE TRIGGER {LOG}_seven BEFORE INSERT ON {LOG} FOR EACH ROW
                 SET NEW.visitor_uid = IF(NEW.visitor_uid = 7, 70, NEW.visitor_uid);
             INSERT INTO {LOG} (uid, visitor_uid, last_update) VALUES
                 (1, 101, '2024-01-01 00:00:01'), (1, 102, '2024-01-01 00:00:02'),
                 (2, 201, '2024-01-01 00:00:03'), (1, 103, '2024-01-01 00:00:04'),
                 (1, 104, '2024-01-01 00:00:05'), (3, 301, '2024-01-01 00:00:06');"
        )
    }

    fn rule_toml(&self) -> String {
        Rule::ring("profile_visits", LOG)
            .key(&["uid"])
            .size(RING_SIZE)
            .ring_table("profile_visits_ring")
            .seq_table("profile_visits_seq")
            .order_by("last_update")
            .toml()
    }

    fn state_query(&self) -> String {
        format!("SELECT * FROM {LOG} ORDER BY id")
    }

    fn physical_queries(&self) -> Vec<String> {
        vec![
            "SELECT * FROM {db}.profile_visits_ring ORDER BY uid, seq".into(),
            "SELECT * FROM {db}.profile_visits_seq ORDER BY uid".into(),
        ]
    }

    /// The ring keeps the latest rows of each key, by insertion (= id) order.
    fn settle_reference(&self, ref_db: &str) {
        common::mariadb().exec(&format!(
            "DELETE FROM {ref_db}.{LOG} WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() \
             OVER (PARTITION BY uid ORDER BY id DESC) AS n FROM {ref_db}.{LOG}) AS x \
             WHERE n > {RING_SIZE})"
        ));
    }

    /// An insert into the session's own key (`10 + session`), so that the ring keeps
    /// the same rows whatever the order of the sessions: a time that is a literal or
    /// `NOW(6)`, sometimes a visitor out of INT's range (1264 when strict, clipped
    /// with a warning otherwise).
    fn session_write(&self, g: &mut Gen, session: usize, k: usize) -> Option<Stmt> {
        let visitor: i64 = if g.chance(10) {
            99_999_999_999
        } else {
            k as i64
        };
        let time = if g.chance(30) {
            "NOW(6)".to_string()
        } else {
            format!("'2024-02-{:02} 10:{:02}:00'", 1 + k / 60, k % 60)
        };
        let mut s = Stmt::new();
        s.sql(format!(
            "INSERT INTO {LOG} (uid, visitor_uid, last_update) VALUES ({}, {visitor}, {time})",
            10 + session
        ));
        s.write = true;
        s.text_only = true;
        Some(s)
    }

    /// The sessions' keys (`10 + session`) as users: the log's foreign key refuses
    /// others, and a session whose every insert fails exercises no merged write.
    fn session_schema(&self) -> String {
        let users: Vec<String> = (10..74).map(|u| format!("({u}, 's{u}')")).collect();
        format!("INSERT INTO users VALUES {};", users.join(", "))
    }

    /// `NOW(6)` values as their offset from UTC in quarter hours: the sessions' zones
    /// are whole quarter hours, and a time with microseconds against the whole-second
    /// `UTC_TIMESTAMP()` lies up to a second either side of one (in hours, −03:30
    /// rounds to −3 or −4 by that second).
    fn session_state_query(&self) -> String {
        format!(
            "SELECT uid, visitor_uid, IF(last_update >= '2025-01-01', CONCAT('now ', \
             ROUND(TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), last_update) / 900)), last_update) \
             FROM {LOG}"
        )
    }

    fn statement(&self, g: &mut Gen) -> Stmt {
        let mut s = Stmt::new();
        match g.below(100) {
            0..=44 => ring_insert(g, &mut s),
            45..=51 => ring_delete(g, &mut s),
            52..=58 => ring_update(g, &mut s),
            59..=96 => ring_select(g, &mut s),
            _ => {
                ring_insert(g, &mut s);
                malformed(g, &mut s);
            }
        }
        s
    }
}

/// A key value; `insert`: for an INSERT (where a NULL key fails differently).
fn uid_lit(g: &mut Gen, insert: bool) -> Lit {
    match g.below(40) {
        0 => g.int_lit(99),
        1 => g.int_lit(-1),
        2 if !insert || g.open("found_ring_null_key_error") => Lit {
            text: "NULL".into(),
            param: Some(RawParam::Null),
        },
        3 => g.string_lit(b"2"),
        _ => {
            let u = g.range(1, 5);
            g.int_lit(u)
        }
    }
}

fn visitor_lit(g: &mut Gen, update: bool) -> Lit {
    match g.below(40) {
        0 if !update || g.open("found_ring_update_error") => g.int_lit(99_999_999_999),
        1 if !update || g.open("found_ring_update_error") => g.string_lit(b"abc"),
        2 => g.int_lit(-7),
        _ => {
            let v = g.range(1000, 9999);
            g.int_lit(v)
        }
    }
}

fn time_lit(g: &mut Gen) -> Lit {
    let m = g.range(0, 59);
    let us = g.range(0, 999_999);
    let t = format!("2024-03-01 10:{m:02}:00.{us:06}");
    let param = Some(RawParam::Bytes(t.clone().into_bytes()));
    let text = match g.below(20) {
        0 => format!("TIMESTAMP'{t}'"),
        1 => format!("20240301100{m:01}00"),
        2 => "'2024-02-30 00:00:00'".to_string(),
        3 => "'2024-03-01'".to_string(),
        _ => format!("'{t}'"),
    };
    Lit {
        text: text.into_bytes(),
        param,
    }
}

fn ring_insert(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    let verb = match g.below(10) {
        0 => g.kw("REPLACE"),
        1 if g.open("found_ring_insert_ignore") => g.kw("INSERT IGNORE"),
        _ => g.kw("INSERT"),
    };
    let into = if g.chance(90) {
        format!(" {}", g.kw("INTO"))
    } else {
        String::new()
    };
    s.sql(format!("{verb}{into} "));
    g.table(s, LOG);
    let ws = g.ws();
    match g.below(12) {
        0 => {
            // SET form.
            let (u, v, t) = (uid_lit(g, true), visitor_lit(g, false), time_lit(g));
            s.sql(" SET uid = ").lit(u).sql(", visitor_uid = ").lit(v);
            s.sql(", last_update = ").lit(t);
        }
        1 => {
            // All columns, id generated.
            let id = *g.pick(&["NULL", "0", "DEFAULT"]);
            let (u, v, t) = (uid_lit(g, true), visitor_lit(g, false), time_lit(g));
            s.sql(format!(" VALUES{ws}({id}, "));
            s.lit(u).sql(", ").lit(v).sql(", ").lit(t).sql(")");
        }
        2 => {
            // Shapes the rule must refuse (or get exactly right).
            let bad = *g.pick(&[
                " (uid, visitor_uid, last_update) SELECT uid, 1, '2024-01-01' FROM users WHERE uid = 4",
                " (uid, visitor_uid, last_update) VALUES (1, 1, '2024-01-01') ON DUPLICATE KEY UPDATE visitor_uid = 2",
                " (uid, visitor_uid) VALUES (1, 1)",
                " (uid, visitor_uid, last_update) VALUES (1, 1, '2024-01-01' + INTERVAL 1 DAY)",
            ]);
            s.sql(bad);
        }
        3 if g.maybe(20, "returning") => {
            s.sql(" (uid, visitor_uid, last_update) VALUES (1, 1, '2024-01-01') RETURNING id");
        }
        4 => {
            // Reordered columns.
            let (u, v, t) = (uid_lit(g, true), visitor_lit(g, false), time_lit(g));
            s.sql(" (last_update, visitor_uid, uid) VALUES (");
            s.lit(t).sql(", ").lit(v).sql(", ").lit(u).sql(")");
        }
        _ => {
            let rows = if g.maybe(15, "doc_ring_multirow_id") {
                g.range(2, 4) as usize
            } else {
                1
            };
            s.sql(format!(" (uid,{ws}visitor_uid, last_update) VALUES "));
            for i in 0..rows {
                if i > 0 {
                    s.sql(", ");
                }
                let (u, v, t) = (uid_lit(g, true), visitor_lit(g, false), time_lit(g));
                s.sql("(").lit(u).sql(", ").lit(v).sql(", ").lit(t).sql(")");
            }
        }
    }
    if g.chance(3) {
        s.sql(";");
    }
}

fn ring_delete(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    let del = g.kw("DELETE FROM");
    s.sql(format!("{del} "));
    g.table(s, LOG);
    s.sql(" WHERE ");
    match g.below(6) {
        0 if g.open("found_ring_partial_delete") => {
            let id = g.range(1, 80);
            let l = g.int_lit(id);
            s.sql("id = ").lit(l);
        }
        1 if g.open("found_ring_partial_delete") => {
            let u = uid_lit(g, false);
            s.sql("uid = ").lit(u).sql(" ORDER BY id LIMIT 1");
        }
        2 if g.open("found_ring_partial_delete") => {
            let u = uid_lit(g, false);
            s.sql("uid = ").lit(u).sql(" AND visitor_uid > 5000");
        }
        _ => {
            let u = uid_lit(g, false);
            s.sql("uid = ").lit(u);
        }
    }
    if g.maybe(10, "limit0") {
        s.sql(" LIMIT 0");
    }
}

fn ring_update(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    let up = g.kw("UPDATE");
    s.sql(format!("{up} "));
    g.table(s, LOG);
    let v = visitor_lit(g, true);
    s.sql(" SET visitor_uid = ").lit(v).sql(" WHERE ");
    match g.below(6) {
        0 => {
            s.sql("visitor_uid > 5000");
        }
        1 => {
            let id = g.range(1, 80);
            let l = g.int_lit(id);
            s.sql("id = ").lit(l);
        }
        _ => {
            let u = uid_lit(g, false);
            s.sql("uid = ").lit(u);
        }
    }
}

fn ring_select(g: &mut Gen, s: &mut Stmt) {
    const READS: &[(&str, bool)] = &[
        ("SELECT * FROM {t} WHERE uid = {u}", false),
        ("SELECT * FROM {t} WHERE uid = {u} ORDER BY id DESC", true),
        ("SELECT * FROM {t} WHERE uid = {u} ORDER BY id DESC LIMIT 2", true),
        ("SELECT visitor_uid, last_update FROM {t} WHERE uid = {u} ORDER BY id", true),
        ("SELECT uid, COUNT(*) FROM {t} GROUP BY uid ORDER BY uid", true),
        ("SELECT COUNT(*) FROM {t} WHERE uid = {u}", true),
        ("SELECT COUNT(*) AS n FROM {t}", true),
        ("SELECT * FROM {t} ORDER BY uid, id", true),
        ("SELECT * FROM {t}", false),
        ("SELECT id, uid FROM {t} WHERE uid = {u} ORDER BY id DESC LIMIT 1", true),
        ("SELECT MAX(id), MIN(visitor_uid) FROM {t} WHERE uid = {u}", true),
        ("SELECT v.visitor_uid, u.name FROM {t} v JOIN users u ON u.uid = v.uid ORDER BY v.id", true),
        ("SELECT u.name, COUNT(v.uid) AS visits FROM users u LEFT JOIN {t} v ON v.uid = u.uid GROUP BY u.name ORDER BY u.name", true),
        ("SELECT name FROM users WHERE uid IN (SELECT uid FROM {t} WHERE visitor_uid > 5000) ORDER BY name", true),
        ("SELECT t.* FROM {t} t WHERE t.uid = {u} ORDER BY t.id", true),
        ("SELECT * FROM {t} WHERE uid = {u} AND visitor_uid > 5000 ORDER BY id", true),
        ("SELECT * FROM {t} WHERE uid IN (1, 2) ORDER BY id LIMIT 0", true),
    ];
    let (template, exact) = *g.pick(READS);
    s.order = if exact {
        Order::Exact
    } else {
        Order::Unordered
    };
    let sel = g.kw("SELECT");
    let template = template.strip_prefix("SELECT").unwrap_or(template);
    s.sql(sel);
    let mut rest = template;
    while let Some(at) = rest.find('{') {
        s.sql(&rest[..at]);
        let end = rest[at..]
            .find('}')
            .map(|e| at + e + 1)
            .unwrap_or(rest.len());
        match &rest[at..end] {
            "{t}" => g.table(s, LOG),
            _ => {
                let u = uid_lit(g, false);
                s.lit(u);
            }
        }
        rest = &rest[end..];
    }
    s.sql(rest);
}
