//! Differential fuzzing of the partition rule (`tests/common/differential.rs`):
//! seeded lookups by key — `=` and `IN`, alone and inside larger WHERE clauses,
//! joins, subqueries, `ORDER BY … LIMIT`, keys whose time lies near midnight, keys
//! whose time cannot be read — in sessions of several time zones, in both
//! protocols, interleaved with inserts, updates and deletes by key, through
//! heatsink on a day-partitioned table with the rule, and directly on the same
//! table without it. Every answer must be the reference's; an insert whose
//! `Inserted` lies outside the key's date ± 1 day is refused through heatsink
//! (and not run on the reference). The same on an hourly-partitioned table with a
//! DATETIME column (`period = "hour"`): rows carry their key's time, and an
//! insert more than 24 hours from the key's hour is refused. The table has a CHECK
//! constraint and a trigger of the application's own (a partitioned table cannot
//! have foreign keys).

mod common;

use common::differential::{Gen, Kind, Lit, Order, Stmt};
use common::fixture::{utc_date, utc_time};

/// Statements per round in the bounded run.
const STATEMENTS: usize = 2000;
/// Rounds in the bounded run.
const ROUNDS: u64 = 2;
/// The bounded run's seed.
const SEED: u64 = 20_261_125;

/// 2024-11-20 00:00:00 UTC.
const DAY0: i64 = 1_732_060_800;
/// Days of data after DAY0.
const DAYS: i64 = 10;
/// Keys in the pool; the first [`STORED`] have rows at the start.
const KEYS: usize = 240;
const STORED: usize = 200;

/// Time zones of the sessions: less than 24 hours apart, so that a key's date in
/// any of them lies within one day of its date in UTC (rules/README.md).
const ZONES: &[&str] = &["'+00:00'", "'+05:30'", "'-08:00'", "'+09:00'"];

#[test]
fn lookups_by_key_match_the_unruled_table() {
    common::differential::run_bounded(&Partition { hourly: false }, SEED, STATEMENTS, ROUNDS);
}

#[test]
fn hourly_lookups_by_key_match_the_unruled_table() {
    common::differential::run_bounded(&Partition { hourly: true }, SEED + 7, STATEMENTS, ROUNDS);
}

/// A key of the pool and the date its row carries.
#[derive(Clone)]
struct Key {
    text: String,
    date: String,
    /// The time its row carries (for the hourly table).
    time: String,
    /// That time, unix seconds.
    t: i64,
    /// The key's time can be read (its date is enforced).
    readable: bool,
}

/// The pool of keys, the same in every call.
fn keys() -> Vec<Key> {
    let mut g = common::differential::Prng::new(11);
    (0..KEYS)
        .map(|i| {
            let a = g.next_u64() % 0xff_ffff_ffff;
            let b = g.next_u64() % 0xff_ffff_ffff;
            let day = (g.next_u64() % DAYS as u64) as i64;
            let into_day = if g.next_u64().is_multiple_of(2) {
                // Near midnight UTC: within two hours either side.
                86_400 + (g.next_u64() % 14_400) as i64 - 7_200
            } else {
                (g.next_u64() % 86_400) as i64
            };
            let t = DAY0 + day * 86_400 + into_day;
            let date = utc_date(t);
            let time = utc_time(t);
            match i % 12 {
                0 => Key {
                    text: format!("bad-key-{a:x}"),
                    date,
                    time: time.clone(),
                    t,
                    readable: false,
                },
                1 => Key {
                    text: format!("{a:010x}-{}-{b:010x}", t % 1_000_000_000),
                    date,
                    time: time.clone(),
                    t,
                    readable: false,
                },
                2 => Key {
                    text: format!("{a:010x}-9999999999-{b:010x}"),
                    date,
                    time: time.clone(),
                    t,
                    readable: false,
                },
                _ => Key {
                    text: format!("{a:010x}-{t}-{b:010x}"),
                    date,
                    time,
                    t,
                    readable: true,
                },
            }
        })
        .collect()
}

/// The partition rule on a day-partitioned table, or (`hourly`) on an
/// hour-partitioned one.
struct Partition {
    hourly: bool,
}

impl Partition {
    /// What a row of `k` carries in `Inserted`.
    fn stamp(&self, k: &Key) -> String {
        if self.hourly {
            k.time.clone()
        } else {
            k.date.clone()
        }
    }
}

impl Kind for Partition {
    fn name(&self) -> &'static str {
        if self.hourly {
            "parth"
        } else {
            "part"
        }
    }

    fn schema(&self) -> String {
        let parts: Vec<String> = if self.hourly {
            (-24..(DAYS + 4) * 24)
                .map(|h| {
                    let t = DAY0 + h * 3600;
                    format!(
                        "PARTITION p{}{:02} VALUES LESS THAN ('{}')",
                        utc_date(t).replace('-', ""),
                        h.rem_euclid(24),
                        utc_time(t + 3600)
                    )
                })
                .collect()
        } else {
            (-2..DAYS + 4)
                .map(|d| {
                    let day = utc_date(DAY0 + d * 86_400);
                    let next = utc_date(DAY0 + (d + 1) * 86_400);
                    format!(
                        "PARTITION p{} VALUES LESS THAN ('{next}')",
                        day.replace('-', "")
                    )
                })
                .collect()
        };
        let rows: Vec<String> = keys()
            .iter()
            .take(STORED)
            .enumerate()
            .map(|(i, k)| format!("('{}', '{{\"n\": {i}}}', '{}')", k.text, self.stamp(k)))
            .collect();
        let column = if self.hourly { "DATETIME" } else { "DATE" };
        format!(
            "CREATE TABLE Messages (ID BIGINT AUTO_INCREMENT, UUID VARCHAR(40) NOT NULL, \
               Message JSON NOT NULL, Inserted {column} NOT NULL, \
               PRIMARY KEY (ID, Inserted), UNIQUE KEY (UUID, Inserted), \
               CONSTRAINT message_key CHECK (UUID <> '')) DEFAULT CHARSET=utf8mb4 \
               PARTITION BY RANGE COLUMNS (Inserted) ({}, PARTITION pmax VALUES LESS THAN (MAXVALUE));
             CREATE TRIGGER messages_trim BEFORE INSERT ON Messages FOR EACH ROW
                 SET NEW.UUID = TRIM(NEW.UUID);
             INSERT INTO Messages (UUID, Message, Inserted) VALUES {};
             CREATE TABLE notes (id INT PRIMARY KEY, label VARCHAR(10) NOT NULL) DEFAULT CHARSET=utf8mb4;
             INSERT INTO notes VALUES (0, 'zero'), (1, 'one'), (2, 'two'), (3, 'three'), (4, 'four');",
            parts.join(", "),
            rows.join(", ")
        )
    }

    fn rule_toml(&self) -> String {
        let rule = common::fixture::Rule::partition("messages_by_day", "Messages").toml();
        if self.hourly {
            rule.replace("period = \"day\"", "period = \"hour\"")
        } else {
            rule
        }
    }

    fn state_query(&self) -> String {
        "SELECT ID, UUID, Message, Inserted FROM Messages ORDER BY ID".into()
    }

    fn statement(&self, g: &mut Gen) -> Stmt {
        let mut s = Stmt::new();
        let pool = keys();
        match g.below(100) {
            0..=2 => {
                let tz = *g.pick(ZONES);
                s.sql(format!("SET time_zone = {tz}"));
                s.text_only = true;
            }
            3..=10 => insert(g, &mut s, &pool, self),
            11..=16 => update(g, &mut s, &pool),
            17..=19 => delete(g, &mut s, &pool),
            _ => read(g, &mut s, &pool),
        }
        s
    }
}

fn key_lit(g: &mut Gen, pool: &[Key]) -> Lit {
    let k = g.pick(pool).text.clone();
    g.string_lit(k.as_bytes())
}

fn insert(g: &mut Gen, s: &mut Stmt, pool: &[Key], kind: &Partition) {
    s.write = true;
    let k = g.pick(pool).clone();
    // Mostly the key's own date (time); now and then three days off (refused
    // through heatsink when the key's time can be read).
    let date = if g.chance(85) || !k.readable {
        kind.stamp(&k)
    } else {
        if kind.hourly {
            // Three to five days from the key's time: outside its hour ± 24 hours
            // in every session's zone. (A time within a day of the key's in the
            // writer's zone may lie outside it in a reader's: rules/README.md.)
            let off = 3 * 86_400 + 3600 * g.below(48) as i64;
            utc_time(if g.chance(50) { k.t + off } else { k.t - off })
        } else {
            // Three to five days from the key's date in UTC: outside its date ± 1
            // day in every session's zone (a key's date there lies within a day
            // of its UTC date). A date drawn from the whole data range could lie
            // a day or two from it: accepted in a writer's zone where it is within
            // the tolerance, then outside the lookup range of a reader in another
            // zone, which misses the row (rules/README.md, "Time zones").
            let d = g.below(6) as i64;
            let off = (3 + d % 3) * 86_400;
            utc_date(if d < 3 { k.t + off } else { k.t - off })
        }
    };
    let n = g.range(0, 1000);
    s.sql(format!("{} INTO ", g.kw("INSERT")));
    g.table(s, "Messages");
    s.sql(" (UUID, Message, Inserted) VALUES (");
    let kl = g.string_lit(k.text.as_bytes());
    let ml = g.string_lit(format!("{{\"i\": {n}}}").as_bytes());
    let dl = g.string_lit(date.as_bytes());
    s.lit(kl).sql(", ").lit(ml).sql(", ").lit(dl).sql(")");
}

fn update(g: &mut Gen, s: &mut Stmt, pool: &[Key]) {
    s.write = true;
    let n = g.range(0, 1000);
    s.sql(format!("{} ", g.kw("UPDATE")));
    g.table(s, "Messages");
    s.sql(" SET Message = ");
    let ml = g.string_lit(format!("{{\"u\": {n}}}").as_bytes());
    s.lit(ml);
    let col = g.column("Messages", "UUID");
    s.sql(format!(" {} {col} = ", g.kw("WHERE")));
    s.lit(key_lit(g, pool));
    if g.chance(30) {
        s.sql(" AND ID > ");
        let id = g.range(0, 150);
        s.lit(g.int_lit(id));
    }
}

fn delete(g: &mut Gen, s: &mut Stmt, pool: &[Key]) {
    s.write = true;
    s.sql(format!("{} ", g.kw("DELETE FROM")));
    g.table(s, "Messages");
    let col = g.column("Messages", "UUID");
    s.sql(format!(" WHERE {col} "));
    if g.chance(25) {
        s.sql("IN (")
            .lit(key_lit(g, pool))
            .sql(", ")
            .lit(key_lit(g, pool))
            .sql(")");
    } else {
        s.sql("= ").lit(key_lit(g, pool));
    }
}

fn read(g: &mut Gen, s: &mut Stmt, pool: &[Key]) {
    let sel = g.kw("SELECT");
    match g.below(8) {
        0 | 1 => {
            s.sql(format!("{sel} ID, UUID, Message, Inserted FROM "));
            g.table(s, "Messages");
            let col = g.column("Messages", "UUID");
            s.sql(format!(" WHERE {col} = ")).lit(key_lit(g, pool));
        }
        2 => {
            s.sql(format!("{sel} Message FROM Messages WHERE "));
            s.lit(key_lit(g, pool)).sql(" = UUID");
        }
        3 => {
            s.sql(format!("{sel} ID, Inserted FROM Messages WHERE UUID IN ("));
            let n = g.range(1, 6);
            for i in 0..n {
                if i > 0 {
                    s.sql(", ");
                }
                s.lit(key_lit(g, pool));
            }
            s.sql(")");
        }
        4 => {
            s.sql(format!(
                "{sel} m.ID, m.Message, n.label FROM Messages m JOIN notes n ON n.id = m.ID % 5 WHERE n.id < 4 AND m.UUID = "
            ));
            s.lit(key_lit(g, pool));
        }
        5 => {
            s.sql(format!("{sel} COUNT(*) AS c FROM Messages WHERE UUID = "));
            s.lit(key_lit(g, pool)).sql(" AND Inserted >= ");
            let d = utc_date(DAY0 + (g.below(DAYS as usize) as i64) * 86_400);
            s.lit(g.string_lit(d.as_bytes()));
        }
        6 => {
            s.sql(format!(
                "{sel} id, label FROM notes WHERE id IN (SELECT ID % 5 FROM Messages WHERE UUID = "
            ));
            s.lit(key_lit(g, pool)).sql(")");
        }
        _ => {
            s.order = Order::Exact;
            s.sql(format!("{sel} ID, UUID FROM Messages WHERE ID > "));
            let id = g.range(0, 100);
            s.lit(g.int_lit(id)).sql(" AND UUID IN (");
            s.lit(key_lit(g, pool))
                .sql(", ")
                .lit(key_lit(g, pool))
                .sql(") ORDER BY ID LIMIT 2");
        }
    }
}
