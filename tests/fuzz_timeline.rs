//! Differential fuzzing of the timeline rule (`tests/common/differential.rs`): the
//! friends-timeline read in its spellings (explicit and comma joins, either table
//! first, aliases, keyset pages, `LIMIT n OFFSET k` and `LIMIT k, n`), in both
//! protocols and the generator's character sets and sql_modes, interleaved with
//! posts, follows, unfollows, deletes and author changes, through heatsink (pull,
//! push and hybrid) and directly on the same tables without the rule. The schema is
//! a production one: the follow table's rows name users through foreign keys (an
//! unfollow by a user's deletion is refused by the key, not cascaded: cascades bypass
//! the mailbox's triggers), messages carry a CHECK, and the application has a
//! trigger of its own.

mod common;

use common::differential::{Gen, Kind, Order, Stmt};
use common::fixture::Rule;
use common::packets::{FLAGS_BY_PLAN, GROUPED_FLAGS_BY_PLAN};

/// Statements per round in the bounded run.
const STATEMENTS: usize = 1200;
/// Rounds in the bounded run.
const ROUNDS: u64 = 2;
/// The bounded run's seed.
const SEED: u64 = 20_261_127;

/// Users in the graph; authors 1–3 are followed by most.
const USERS: i64 = 40;

#[test]
fn pull_timelines_match_the_plain_tables() {
    common::differential::run_bounded(&Timeline { mode: "pull" }, SEED, STATEMENTS, ROUNDS);
}

#[test]
fn push_timelines_match_the_plain_tables() {
    common::differential::run_bounded(&Timeline { mode: "push" }, SEED + 1, STATEMENTS, ROUNDS);
}

#[test]
fn hybrid_timelines_match_the_plain_tables() {
    common::differential::run_bounded(&Timeline { mode: "hybrid" }, SEED + 2, STATEMENTS, ROUNDS);
}

struct Timeline {
    mode: &'static str,
}

impl Kind for Timeline {
    fn name(&self) -> &'static str {
        match self.mode {
            "pull" => "timeline_pull",
            "push" => "timeline_push",
            _ => "timeline_hybrid",
        }
    }

    fn schema(&self) -> String {
        let mut g = common::differential::Prng::new(5);
        let users: Vec<String> = (1..=USERS).map(|u| format!("({u}, 'u{u}')")).collect();
        let mut follows = Vec::new();
        for reader in 1..=USERS {
            for author in 1..=USERS {
                let p = if author <= 3 { 80 } else { 12 };
                if author != reader && (g.next_u64() % 100) < p {
                    follows.push(format!("({reader}, {author})"));
                }
            }
        }
        let messages: Vec<String> = (0..600)
            .map(|i| {
                let author = if g.next_u64().is_multiple_of(3) {
                    1 + g.next_u64() % 3
                } else {
                    1 + g.next_u64() % USERS as u64
                };
                format!("({author}, 'm{i}')")
            })
            .collect();
        format!(
            "CREATE TABLE users (id INT UNSIGNED PRIMARY KEY, name VARCHAR(20) NOT NULL);
             INSERT INTO users VALUES {};
             CREATE TABLE follower (user_id INT UNSIGNED NOT NULL, follower_id INT UNSIGNED NOT NULL, \
                 PRIMARY KEY (user_id, follower_id), KEY (follower_id), \
                 CONSTRAINT follower_reader FOREIGN KEY (user_id) REFERENCES users (id), \
                 CONSTRAINT follower_author FOREIGN KEY (follower_id) REFERENCES users (id));
             CREATE TABLE message (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, user_id INT UNSIGNED NOT NULL, \
                 body VARCHAR(255) NOT NULL, KEY user_id_id (user_id, id), \
                 CONSTRAINT message_body CHECK (body <> ''));
             CREATE TRIGGER message_trim BEFORE INSERT ON message FOR EACH ROW
                 SET NEW.body = TRIM(NEW.body);
             INSERT INTO follower VALUES {};
             INSERT INTO message (user_id, body) VALUES {};",
            users.join(", "),
            follows.join(", "),
            messages.join(", ")
        )
    }

    fn rule_toml(&self) -> String {
        let r = Rule::timeline("friends").set("mode", format!("\"{}\"", self.mode));
        match self.mode {
            "pull" => r,
            // A small mailbox, so that pages beyond it take pull's bound; hybrid with a
            // fan-out limit the popular authors exceed.
            _ => r
                .set("mailbox", "\"mailbox\"")
                .set("mailbox_size", "12")
                .set("fanout_limit", "20"),
        }
        .toml()
    }

    fn state_query(&self) -> String {
        "SELECT (SELECT COUNT(*) FROM follower), (SELECT COALESCE(SUM(user_id * 1000 + follower_id), 0) FROM follower), \
         (SELECT COUNT(*) FROM message), (SELECT COALESCE(SUM(id * 7 + user_id), 0) FROM message)"
            .into()
    }

    fn physical_queries(&self) -> Vec<String> {
        if self.mode == "pull" {
            return Vec::new();
        }
        // Mailbox entries that are not on their reader's timeline: 0 in every state.
        vec!["SELECT COUNT(*) FROM {db}.mailbox b \
              LEFT JOIN {db}.message m ON m.id = b.hs_message AND m.user_id = b.hs_author \
              LEFT JOIN {db}.follower f ON f.user_id = b.hs_reader AND f.follower_id = b.hs_author \
              WHERE m.id IS NULL OR f.user_id IS NULL"
            .into()]
    }

    fn statement(&self, g: &mut Gen) -> Stmt {
        let mut s = Stmt::new();
        match g.below(100) {
            0..=9 => post(g, &mut s),
            10..=15 => follow(g, &mut s),
            16..=20 => unfollow(g, &mut s),
            21..=23 => {
                s.write = true;
                s.sql("DELETE FROM message WHERE user_id = ");
                let u = user(g);
                s.lit(g.int_lit(u)).sql(" ORDER BY id DESC LIMIT 1");
            }
            24..=25 => {
                s.write = true;
                s.sql("UPDATE message SET user_id = ");
                let (a, b) = (user(g), user(g));
                s.lit(g.int_lit(a))
                    .sql(" WHERE user_id = ")
                    .lit(g.int_lit(b))
                    .sql(" ORDER BY id DESC LIMIT 1");
            }
            26 => {
                // A user whose follows still name them: the foreign key refuses it.
                s.write = true;
                s.sql("DELETE FROM users WHERE id = ");
                let u = user(g);
                s.lit(g.int_lit(u));
            }
            _ => read(g, &mut s),
        }
        s
    }
}

/// A user: a third of the time one of the popular authors, now and then one that
/// does not exist (the foreign keys refuse it).
fn user(g: &mut Gen) -> i64 {
    match g.below(30) {
        0 => USERS + 5,
        1..=10 => g.range(1, 4),
        _ => g.range(1, USERS + 1),
    }
}

fn post(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    s.sql(format!("{} INTO ", g.kw("INSERT")));
    g.table(s, "message");
    s.sql(" (user_id, body) VALUES (");
    let u = user(g);
    let body = *g.pick(&["hello", " padded ", "x", "", "posted"]);
    let (ul, bl) = (g.int_lit(u), g.string_lit(body.as_bytes()));
    s.lit(ul).sql(", ").lit(bl).sql(")");
    if g.chance(25) {
        let u = user(g);
        let ul = g.int_lit(u);
        s.sql(", (").lit(ul).sql(", 'second')");
    }
}

fn follow(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    let ignore = g.chance(60);
    s.sql(if ignore {
        "INSERT IGNORE INTO "
    } else {
        "INSERT INTO "
    });
    g.table(s, "follower");
    s.sql(" (user_id, follower_id) VALUES (");
    let (r, a) = (user(g), user(g));
    let (rl, al) = (g.int_lit(r), g.int_lit(a));
    s.lit(rl).sql(", ").lit(al).sql(")");
}

fn unfollow(g: &mut Gen, s: &mut Stmt) {
    s.write = true;
    s.sql(format!("{} ", g.kw("DELETE FROM")));
    g.table(s, "follower");
    let r = user(g);
    let rl = g.int_lit(r);
    s.sql(" WHERE user_id = ").lit(rl);
    if g.chance(50) {
        let a = user(g);
        let al = g.int_lit(a);
        s.sql(" AND follower_id = ").lit(al);
    } else {
        s.sql(" ORDER BY follower_id LIMIT 1");
    }
}

/// The friends-timeline read in one of its spellings.
fn read(g: &mut Gen, s: &mut Stmt) {
    s.order = Order::Exact;
    s.flags_mask = FLAGS_BY_PLAN;
    let sel = g.kw("SELECT");
    let reader = user(g);
    let rl = g.int_lit(reader);
    let n = g.range(1, 15);
    match g.below(6) {
        0 => {
            s.sql(format!(
                "{sel} message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id WHERE follower.user_id = "
            ))
            .lit(rl)
            .sql(format!(" ORDER BY message.id DESC LIMIT {n}"));
        }
        1 => {
            let k = g.range(0, 20);
            s.sql(format!(
                "{sel} * FROM message m, follower f WHERE m.user_id = f.follower_id AND f.user_id = "
            ))
            .lit(rl)
            .sql(format!(" ORDER BY m.id DESC LIMIT {n} OFFSET {k}"));
        }
        2 => {
            s.sql(format!(
                "{sel} m.id, m.body AS text, f.follower_id FROM follower f JOIN message m ON f.follower_id = m.user_id WHERE "
            ))
            .lit(rl)
            .sql(format!(" = f.user_id ORDER BY m.id DESC LIMIT {n}"));
        }
        3 => {
            let below = g.range(1, 700);
            let bl = g.int_lit(below);
            s.sql(format!(
                "{sel} m.* FROM message AS m JOIN follower AS f ON m.user_id = f.follower_id WHERE f.user_id = "
            ))
            .lit(rl)
            .sql(" AND m.id < ")
            .lit(bl)
            .sql(format!(" ORDER BY m.id DESC LIMIT {n}"));
        }
        4 => {
            let k = g.range(0, 20);
            s.sql(format!(
                "{sel} * FROM message JOIN follower ON message.user_id = follower.follower_id WHERE follower.user_id = "
            ))
            .lit(rl)
            .sql(format!(" ORDER BY message.id DESC LIMIT {k}, {n}"));
        }
        _ => {
            // Not the timeline's shape: forwarded as sent. The count's BINARY flag
            // follows the plan too (grouped through a temporary table or not).
            s.flags_mask = GROUPED_FLAGS_BY_PLAN;
            s.sql(format!(
                "{sel} m.id, COUNT(*) AS n FROM message m JOIN follower f ON m.user_id = f.follower_id WHERE f.user_id = "
            ))
            .lit(rl)
            .sql(" GROUP BY m.id ORDER BY m.id DESC LIMIT 5");
        }
    }
}
