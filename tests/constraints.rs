//! What the ruled tables enforce and who may use them (issue 22, items 1–3), through
//! the proxy and `heatsink check` / `heatsink migrate` against a real MariaDB:
//!
//! - cascading foreign keys into a rollup log or a timeline with a mailbox are
//!   refused at check and migrate, naming the constraint;
//! - the ring table keeps the log's CHECK constraints, foreign keys and BEFORE
//!   INSERT triggers (the same errors as directly); what it cannot keep is refused;
//! - a counter column under a CHECK is refused;
//! - users granted only the logical table get the side tables from migrate, check
//!   lists who lacks them, and a privilege error names the logical table.
//!
//! Each test works in its own database (and its own users).

mod common;

use std::path::Path;
use std::time::Duration;

use common::cli::{heatsink, migrate};
use common::client::{connect, fill, rules_dir, run};
use common::fixture::{fresh_db, Env, Rule};
use common::mariadb;
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

const LIMIT: Duration = Duration::from_secs(120);

/// `heatsink check --rules <dir> --backend-url <db>`: (exit code, stdout + stderr).
fn check(rules: &Path, db: &str) -> (i32, String) {
    let url = mariadb().url(db);
    let (code, out, err) = heatsink(&[
        "check",
        "--rules",
        rules.to_str().unwrap(),
        "--backend-url",
        &url,
    ]);
    (code, format!("{out}\n{err}"))
}

/// Asserts that `check --backend-url` and `migrate` both refuse `toml` in `db` with a
/// message containing every one of `words`, and that migrate changed nothing.
fn assert_refused(db: &str, toml: &str, words: &[&str]) {
    let d = rules_dir("r.toml", toml);
    let (code, out) = check(d.path(), db);
    assert_eq!(code, 1, "check should refuse:\n{out}");
    for w in words {
        assert!(out.contains(w), "check output lacks {w:?}:\n{out}");
    }
    let (code, out, err) = migrate(d.path(), db, true);
    assert_ne!(code, 0, "migrate should refuse:\n{out}\n{err}");
    let all = format!("{out}\n{err}");
    for w in words {
        assert!(all.contains(w), "migrate output lacks {w:?}:\n{all}");
    }
    assert!(all.contains("nothing was changed"), "{all}");
}

/// `heatsink migrate --apply` as root (who has the GRANT OPTION), with `extra` flags.
fn migrate_as_root(rules: &Path, db: &str, extra: &[&str]) -> (i32, String, String) {
    let url = mariadb().admin_url(db);
    let mut args = vec![
        "migrate",
        "--rules",
        rules.to_str().unwrap(),
        "--backend-url",
        &url,
        "--apply",
    ];
    args.extend_from_slice(extra);
    heatsink(&args)
}

/// The server error of `sql` on `conn` (panics when it succeeds).
async fn server_error(conn: &mut Conn, sql: &str) -> (u16, String) {
    match conn.query_drop(sql).await {
        Err(mysql_async::Error::Server(e)) => (e.code, e.message),
        other => panic!("{sql}: expected a server error, got {other:?}"),
    }
}

/// Creates user `name`@'%' (password `pw`) afresh.
fn fresh_user(name: &str) {
    mariadb().exec(&format!(
        "DROP USER IF EXISTS '{name}'@'%'; CREATE USER '{name}'@'%' IDENTIFIED BY 'pw'"
    ));
}

/// A connection as `user` (password `pw`) through `env`'s proxy, in its database.
async fn proxied_as(env: &Env, user: &str) -> Conn {
    connect(&format!(
        "mysql://{user}:pw@{}/{}?prefer_socket=false",
        env.proxy.addr(),
        env.db
    ))
    .await
}

/// A connection as `user` straight to MariaDB.
async fn direct_as(db: &str, user: &str) -> Conn {
    connect(&format!(
        "mysql://{user}:pw@{}/{db}?prefer_socket=false",
        mariadb().addr()
    ))
    .await
}

// ---------------------------------------------------------------------------------------
// 1. Cascading foreign keys

const TRACKS: &str =
    "CREATE TABLE tracks (id INT PRIMARY KEY); INSERT INTO tracks VALUES (3), (4);";

fn plays_rule() -> String {
    Rule::rollup("plays_daily", "ev", "ev_daily", "created_at", "day")
        .dimensions(&["track_id"])
        .toml()
}

#[test]
fn rollup_log_with_a_cascading_foreign_key_is_refused() {
    let db = "hs_con_rollup_fk";
    fresh_db(
        db,
        &format!(
            "{TRACKS} CREATE TABLE ev (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at DATETIME, \
             track_id INT, CONSTRAINT ev_track FOREIGN KEY (track_id) REFERENCES tracks (id) \
             ON DELETE CASCADE ON UPDATE CASCADE);"
        ),
    );
    assert_refused(
        db,
        &plays_rule(),
        &[
            "`ev_track`",
            "ON DELETE CASCADE",
            "ON DELETE RESTRICT",
            "`ev_daily`",
        ],
    );
    // SET NULL changes the log's rows too.
    mariadb().exec(&format!(
        "ALTER TABLE {db}.ev DROP FOREIGN KEY ev_track, ADD CONSTRAINT ev_track2 FOREIGN KEY \
         (track_id) REFERENCES {db}.tracks (id) ON DELETE RESTRICT ON UPDATE SET NULL"
    ));
    assert_refused(db, &plays_rule(), &["`ev_track2`", "ON UPDATE SET NULL"]);

    // RESTRICT: accepted, and deleting a referenced track fails as it does directly.
    mariadb().exec(&format!(
        "ALTER TABLE {db}.ev DROP FOREIGN KEY ev_track2, ADD CONSTRAINT ev_track3 FOREIGN KEY \
         (track_id) REFERENCES {db}.tracks (id)"
    ));
    let env = Env::builder(db)
        .rule("r.toml", plays_rule())
        .migrate()
        .start();
    run(LIMIT, async {
        let mut c = env.proxied().await;
        c.query_drop("INSERT INTO ev (created_at, track_id) VALUES ('2026-11-20 10:00:00', 3), ('2026-11-20 11:00:00', 3)")
            .await
            .unwrap();
        let (code, _) = server_error(&mut c, "DELETE FROM tracks WHERE id = 3").await;
        assert_eq!(code, 1451);
        let n: Option<i64> = c
            .query_first("SELECT COUNT(*) AS n FROM ev WHERE track_id = 3")
            .await
            .unwrap();
        assert_eq!(n, Some(2));
        // Child rows deleted explicitly first, as the message advises: exact.
        c.query_drop("DELETE FROM ev WHERE track_id = 3")
            .await
            .unwrap();
        c.query_drop("DELETE FROM tracks WHERE id = 3")
            .await
            .unwrap();
        let n: Option<i64> = c
            .query_first("SELECT COUNT(*) AS n FROM ev WHERE track_id = 3")
            .await
            .unwrap();
        assert_eq!(n, Some(0));
    });
}

const USERS_AND_TIMELINE: &str = "CREATE TABLE users (id INT UNSIGNED PRIMARY KEY); \
     INSERT INTO users VALUES (1), (2), (3); \
     CREATE TABLE follower (user_id INT UNSIGNED NOT NULL, follower_id INT UNSIGNED NOT NULL, \
     PRIMARY KEY (user_id, follower_id), KEY (follower_id), \
     CONSTRAINT follows_user FOREIGN KEY (follower_id) REFERENCES users (id) ON DELETE CASCADE); \
     CREATE TABLE message (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, user_id INT UNSIGNED NOT NULL, \
     body VARCHAR(255) NOT NULL, KEY user_id_id (user_id, id));";

#[test]
fn timeline_with_a_mailbox_refuses_cascading_foreign_keys() {
    let db = "hs_con_timeline_fk";
    fresh_db(db, USERS_AND_TIMELINE);
    let push = Rule::timeline("friends")
        .set("mode", "\"push\"")
        .set("mailbox", "\"mailbox\"")
        .set("mailbox_size", "40")
        .toml();
    assert_refused(
        db,
        &push,
        &["`follows_user`", "ON DELETE CASCADE", "`mailbox`"],
    );

    // Pull keeps no derived rows: the cascade is the server's business, and exact.
    let pull = Rule::timeline("friends").toml();
    let d = rules_dir("r.toml", &pull);
    let (code, out) = check(d.path(), db);
    assert_eq!(code, 0, "{out}");
}

// ---------------------------------------------------------------------------------------
// 2. What the ring keeps of the log, what the counter refuses

const RING_SCHEMA: &str = "CREATE TABLE users (id INT PRIMARY KEY); INSERT INTO users VALUES (1), (2); \
     CREATE TABLE ev (id INT AUTO_INCREMENT PRIMARY KEY, uid INT NOT NULL, n INT NOT NULL CHECK (n >= 0), \
     CONSTRAINT small CHECK (n < 100), \
     CONSTRAINT ev_user FOREIGN KEY (uid) REFERENCES users (id) ON DELETE CASCADE); \
     CREATE TRIGGER ev_no_42 BEFORE INSERT ON ev FOR EACH ROW \
     IF NEW.n = 42 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no 42'; END IF;";

fn ring_rule() -> String {
    Rule::ring("latest", "ev")
        .key(&["uid"])
        .size(3)
        .ring_table("ev_ring")
        .toml()
}

#[test]
fn ring_keeps_the_logs_checks_foreign_keys_and_triggers() {
    let db = "hs_con_ring";
    let env = Env::builder(db)
        .schema(RING_SCHEMA)
        .rule("r.toml", ring_rule())
        .migrate()
        .start();
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        for sql in [
            "INSERT INTO ev (uid, n) VALUES (1, 200)",
            "INSERT INTO ev (uid, n) VALUES (1, -1)",
            "INSERT INTO ev (uid, n) VALUES (9, 1)",
            "INSERT INTO ev (uid, n) VALUES (1, 42)",
        ] {
            let direct = server_error(&mut d, sql).await;
            let proxied = server_error(&mut p, sql).await;
            assert_eq!(proxied, direct, "{sql}");
        }
        // Messages name the log and its constraints, as directly.
        let (code, message) = server_error(&mut p, "INSERT INTO ev (uid, n) VALUES (9, 1)").await;
        assert_eq!(code, 1452);
        assert!(
            message.contains(&format!("(`{db}`.`ev`, CONSTRAINT `ev_user`")),
            "{message}"
        );
        let (code, message) = server_error(&mut p, "INSERT INTO ev (uid, n) VALUES (1, 200)").await;
        assert_eq!(
            (code, message),
            (4025, format!("CONSTRAINT `small` failed for `{db}`.`ev`"))
        );
        assert_eq!(
            server_error(&mut p, "INSERT INTO ev (uid, n) VALUES (1, 42)").await,
            (1644, "no 42".to_string())
        );

        // Good rows are kept; the cascade on the key column deletes whole rings.
        for (uid, n) in [(1, 1), (1, 2), (2, 3)] {
            p.query_drop(format!("INSERT INTO ev (uid, n) VALUES ({uid}, {n})"))
                .await
                .unwrap();
        }
        let count = |uid: i32| format!("SELECT COUNT(*) FROM ev WHERE uid = {uid}");
        let n: Option<i64> = p.query_first(count(1)).await.unwrap();
        assert_eq!(n, Some(2));
        d.query_drop("DELETE FROM users WHERE id = 1")
            .await
            .unwrap();
        let n: Option<i64> = p.query_first(count(1)).await.unwrap();
        assert_eq!(n, Some(0));
        let n: Option<i64> = p.query_first(count(2)).await.unwrap();
        assert_eq!(n, Some(1));
    });

    // The copies: named after the ring; a second migrate has nothing to do.
    let show = mariadb().query_strings(&format!("SHOW CREATE TABLE {db}.ev_ring"));
    let ddl = show[0][1].clone().unwrap();
    assert!(
        ddl.contains("CONSTRAINT `small` CHECK (`n` < 100)"),
        "{ddl}"
    );
    assert!(
        ddl.contains("`n` int(11) NOT NULL CHECK (`n` >= 0)"),
        "{ddl}"
    );
    assert!(
        ddl.contains("CONSTRAINT `ev_ring__ev_user` FOREIGN KEY (`uid`)"),
        "{ddl}"
    );
    let (code, out, err) = migrate(env.rules_path(), db, true);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("-- trigger `hs_con_ring`.`ev_ring__ev_no_42` exists"),
        "{out}"
    );
    assert!(!out.contains("-- applied"), "{out}");
}

#[test]
fn ring_refuses_what_it_cannot_keep() {
    let db = "hs_con_ring_refused";
    let base = "CREATE TABLE users (id INT PRIMARY KEY); \
         CREATE TABLE ev (id INT AUTO_INCREMENT PRIMARY KEY, uid INT NOT NULL, other INT, n INT);";
    // Another table references the log: rows inserted through heatsink never reach it.
    fresh_db(
        db,
        &format!("{base} CREATE TABLE notes (ev_id INT, CONSTRAINT note_ev FOREIGN KEY (ev_id) REFERENCES ev (id));"),
    );
    assert_refused(db, &ring_rule(), &["`note_ev`", "`notes`", "1452"]);
    // A cascade that deletes some of a key's rows.
    fresh_db(
        db,
        &format!("{base} ALTER TABLE ev ADD CONSTRAINT ev_other FOREIGN KEY (other) REFERENCES users (id) ON DELETE CASCADE;"),
    );
    assert_refused(
        db,
        &ring_rule(),
        &["`ev_other`", "some of a key's rows", "ON DELETE RESTRICT"],
    );
    // A cascade that moves rows to another key.
    fresh_db(
        db,
        &format!("{base} ALTER TABLE ev ADD CONSTRAINT ev_uid FOREIGN KEY (uid) REFERENCES users (id) ON UPDATE CASCADE;"),
    );
    assert_refused(db, &ring_rule(), &["`ev_uid`", "ON UPDATE"]);
    // A trigger nothing heatsink runs would fire.
    fresh_db(
        db,
        &format!("{base} CREATE TABLE audit (n INT); CREATE TRIGGER ev_audit AFTER INSERT ON ev FOR EACH ROW INSERT INTO audit VALUES (NEW.n);"),
    );
    assert_refused(db, &ring_rule(), &["`ev_audit` (AFTER INSERT)"]);
}

#[test]
fn counter_column_under_a_check_is_refused() {
    let db = "hs_con_counter";
    fresh_db(
        db,
        "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0 CHECK (cnt <= 1000000));",
    );
    let rule = Rule::counter("page_hits", "hits").toml();
    assert_refused(
        db,
        &rule,
        &[
            "counter column `cnt`",
            "CHECK constraint `cnt`",
            "`cnt` <= 1000000",
        ],
    );
    // A table-level CHECK naming the column is found too.
    fresh_db(
        db,
        "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0, \
         CONSTRAINT cap CHECK (cnt <= 1000000));",
    );
    assert_refused(db, &rule, &["CHECK constraint `cap`"]);
    // A CHECK on another column is the base row's and stays enforced.
    fresh_db(
        db,
        "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0, \
         CONSTRAINT slug_len CHECK (CHAR_LENGTH(slug) > 1));",
    );
    let d = rules_dir("r.toml", &rule);
    let (code, out, err) = migrate(d.path(), db, true);
    assert_eq!(code, 0, "{out}\n{err}");
}

/// Database `db` with `pages` holding these keys (`('a'), ('b')`) and two counter
/// tables `table` makes: `hits`, under a counter rule (migrated), and its plain twin
/// `hits_ref`; a proxy in front.
fn counter_twins(db: &str, pages: &str, table: impl Fn(&str) -> String) -> Env {
    fresh_db(
        db,
        &format!(
            "CREATE TABLE pages (slug VARCHAR(64) PRIMARY KEY); \
             INSERT INTO pages VALUES {pages}; {} {}",
            table("hits"),
            table("hits_ref")
        ),
    );
    let rule = Rule::counter("page_hits", "hits").toml();
    let d = rules_dir("r.toml", &rule);
    let (code, out, err) = migrate(d.path(), db, true);
    assert_eq!(code, 0, "{out}\n{err}");
    Env::builder(db).rule("r.toml", rule).start()
}

/// A counter upsert whose row the table refuses — a missing parent under a `RESTRICT`
/// foreign key (1452), a CHECK on another column (4025) — or that collides on another
/// unique key (the plain table then updates that other row) does exactly what it does
/// to a plain twin table: same error or affected rows, same rows after, text and
/// prepared, alone and inside a transaction. So does a NULL key, which the probe's
/// `IGNORE` would store as '' and then fail the CHECK with, where the statement fails
/// with 1048. The rewrite's probes (`INSERT IGNORE` of
/// the row, then of the key alone) show the proxy that the skip was not the key's
/// duplicate; it undoes them and runs the statement as sent, and no slot row stays
/// behind. An existing key's upsert still lands in a slot row.
#[test]
fn counter_upserts_of_refused_rows_fail_like_the_table() {
    let db = "hs_con_counter_fk";
    let env = counter_twins(db, "('home'), ('h'), ('ab'), ('cd'), ('ef')", |name| {
        format!(
            "CREATE TABLE {name} (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0, \
             note VARCHAR(8), UNIQUE KEY u_note (note), \
             CONSTRAINT slug_len CHECK (CHAR_LENGTH(slug) > 1), \
             FOREIGN KEY (slug) REFERENCES pages (slug) ON DELETE RESTRICT); \
             INSERT INTO {name} VALUES ('home', 5, 'h');"
        )
    });
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut r = env.direct().await;
        let upsert = |row: &str| {
            format!("INSERT INTO {{t}} (slug, cnt, note) VALUES {row} ON DUPLICATE KEY UPDATE cnt = cnt + 1")
        };
        let mut scenario: Vec<String> = [
            "('nopage', 1, NULL)", // the foreign key: 1452
            "('h', 1, NULL)",      // the CHECK: 4025
            "(NULL, 1, NULL)",     // 1048 (IGNORE would store '' and fail the CHECK)
            "('ab', 1, 'h')",      // a new key, a duplicate note: updates 'home'
            "('home', 1, 'x')",    // the key exists: a slot row
            "('ab', 1, 'y')",      // a new key: inserted
            "('ab', 1, 'h')",      // the key exists (checked first): a slot row
        ]
        .iter()
        .map(|row| upsert(row))
        .collect();
        // The key and the counter alone: the row probe is the key probe too.
        for row in ["('nopage', 1)", "('home', 1)", "(NULL, 1)"] {
            scenario.push(format!(
                "INSERT INTO {{t}} (slug, cnt) VALUES {row} ON DUPLICATE KEY UPDATE cnt = cnt + 1"
            ));
        }
        scenario.extend(
            [
                "BEGIN",
                &upsert("('nopage', 1, NULL)"),
                &upsert("('cd', 1, 'h')"),
                &upsert("('cd', 1, NULL)"),
                "COMMIT",
                "SELECT * FROM {t} ORDER BY slug",
            ]
            .map(str::to_string),
        );
        for template in &scenario {
            let po = outcome_or_error(&mut p, &fill(template, "hits", db), false, ()).await;
            let ro = outcome_or_error(&mut r, &fill(template, "hits_ref", db), false, ()).await;
            assert_eq!(po, ro, "{template}\n{}", env.proxy.log_text());
        }
        let prepared = "INSERT INTO {t} (slug, cnt, note) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE cnt = cnt + VALUES(cnt)";
        for (slug, note) in [
            ("nopage", None),
            ("h", None),
            ("ef", Some("h")),
            ("ef", Some("z")),
            ("ef", Some("h")),
        ] {
            let params = (slug, 1, note);
            let po = outcome_or_error(&mut p, &fill(prepared, "hits", db), true, params).await;
            let ro = outcome_or_error(&mut r, &fill(prepared, "hits_ref", db), true, params).await;
            assert_eq!(po, ro, "{slug} {note:?}\n{}", env.proxy.log_text());
        }
        same(&mut p, &mut r, "SELECT * FROM {t} ORDER BY slug", db, &env).await;
        assert_eq!(
            env.backend_rows("SELECT DISTINCT slug FROM {db}.hits_slots ORDER BY slug"),
            [["ab"], ["cd"], ["ef"], ["home"]].map(|r| r.map(|s| Some(s.to_string())).to_vec()),
            "slot rows only for the upserts of existing keys"
        );
    });
}

/// An increment of a key without a row whose row the table refuses — a missing parent
/// under a `RESTRICT` foreign key (1452), a CHECK (4025), a `BEFORE INSERT` trigger's
/// SIGNAL, a duplicate of another unique key — matches no row and changes nothing, as
/// on a plain twin table: the slot trigger's insert of the key's row fails the slot
/// upsert, and the proxy runs the UPDATE as sent (counted as a fallback). Text and
/// prepared, alone, inside a transaction, and merged with other sessions' increments
/// of an existing key; no slot row stays behind for a refused key. An existing key's
/// increment still lands in a slot row, and a key the table takes is created.
#[test]
fn counter_increments_of_keys_the_table_refuses_match_no_row() {
    let db = "hs_con_counter_inc";
    let env = counter_twins(db, "('home'), ('h'), ('ab'), ('cd'), ('blocked')", |name| {
        format!(
            "CREATE TABLE {name} (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0, \
             tag VARCHAR(8) NOT NULL DEFAULT 'new', UNIQUE KEY u_tag (tag), \
             CONSTRAINT {name}_len CHECK (CHAR_LENGTH(slug) > 1), \
             FOREIGN KEY (slug) REFERENCES pages (slug) ON DELETE RESTRICT); \
             CREATE TRIGGER {name}_guard BEFORE INSERT ON {name} FOR EACH ROW \
             IF NEW.slug = 'blocked' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'blocked'; END IF; \
             INSERT INTO {name} VALUES ('home', 5, 'h');"
        )
    });
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut r = env.direct().await;
        let inc = |slug: &str| format!("UPDATE {{t}} SET cnt = cnt + 1 WHERE slug = '{slug}'");
        for slug in ["nopage", "h", "blocked", "home"] {
            same(&mut p, &mut r, &inc(slug), db, &env).await;
        }
        // 'ab' is created through the proxy with the default tag 'new' (the plain
        // table matches nothing: the documented difference), after which a second
        // new key collides with it on the unique tag.
        p.query_drop(fill(&inc("ab"), "hits", db)).await.unwrap();
        assert_eq!(p.affected_rows(), 1);
        same(&mut p, &mut r, &inc("cd"), db, &env).await;
        for template in [
            "BEGIN".to_string(),
            inc("nopage"),
            inc("home"),
            inc("blocked"),
            "COMMIT".into(),
            "SET autocommit = 0".into(),
            inc("h"),
            inc("home"),
            "ROLLBACK".into(),
            "SET autocommit = 1".into(),
        ] {
            same(&mut p, &mut r, &template, db, &env).await;
        }
        let prepared = "UPDATE {t} SET cnt = cnt + ? WHERE slug = ?";
        for slug in ["nopage", "h", "blocked", "cd", "home"] {
            let params = (2, slug);
            let po = outcome_or_error(&mut p, &fill(prepared, "hits", db), true, params).await;
            let ro = outcome_or_error(&mut r, &fill(prepared, "hits_ref", db), true, params).await;
            assert_eq!(po, ro, "{slug}\n{}", env.proxy.log_text());
        }
        // Merged: sessions incrementing the existing key and refused ones at once.
        let mut tasks = Vec::new();
        for i in 0..8 {
            let mut c = env.proxied().await;
            let slug = ["home", "nopage", "home", "h"][i % 4];
            tasks.push(tokio::spawn(async move {
                let mut matched = 0;
                for _ in 0..25 {
                    c.query_drop(format!(
                        "UPDATE hits SET cnt = cnt + 1 WHERE slug = '{slug}'"
                    ))
                    .await
                    .unwrap();
                    matched += c.affected_rows();
                }
                (slug, matched)
            }));
        }
        let mut home = 0;
        for t in tasks {
            let (slug, matched) = t.await.unwrap();
            match slug {
                "home" => home += matched,
                _ => assert_eq!(matched, 0, "{slug}"),
            }
        }
        assert_eq!(home, 100);
        r.query_drop(format!(
            "UPDATE {db}.hits_ref SET cnt = cnt + 100 WHERE slug = 'home'"
        ))
        .await
        .unwrap();
        same(
            &mut p,
            &mut r,
            "SELECT slug, cnt FROM {t} WHERE slug <> 'ab' ORDER BY slug",
            db,
            &env,
        )
        .await;
        assert_eq!(
            env.backend_rows("SELECT DISTINCT slug FROM {db}.hits_slots ORDER BY slug"),
            [["ab"], ["home"]].map(|r| r.map(|s| Some(s.to_string())).to_vec()),
            "slot rows only for the keys with a row"
        );
    });
}

/// Runs `template` through the proxy on `hits` and directly on `hits_ref`, and
/// asserts that both answer alike (rows, affected rows, warnings, info, or error).
async fn same(p: &mut Conn, r: &mut Conn, template: &str, db: &str, env: &Env) {
    let po = outcome_or_error(p, &fill(template, "hits", db), false, ()).await;
    let pi = p.info().to_string();
    let ro = outcome_or_error(r, &fill(template, "hits_ref", db), false, ()).await;
    let ri = r.info().to_string();
    assert_eq!((po, pi), (ro, ri), "{template}\n{}", env.proxy.log_text());
}

/// What a client sees of `sql` (an execute with `params` when `prepared`): rows and
/// their values, affected rows and warnings, or the error's code and SQLSTATE.
async fn outcome_or_error(
    conn: &mut Conn,
    sql: &str,
    prepared: bool,
    params: impl Into<mysql_async::Params> + Send,
) -> Result<(Vec<Vec<Option<String>>>, u64, u16), (u16, String)> {
    let rows: Result<Vec<mysql_async::Row>, _> = match prepared {
        true => conn.exec(sql, params).await,
        false => conn.query(sql).await,
    };
    match rows {
        Ok(rows) => Ok((
            rows.into_iter()
                .map(|r| {
                    r.unwrap()
                        .into_iter()
                        .map(|v| match v {
                            mysql_async::Value::NULL => None,
                            v => Some(v.as_sql(true)),
                        })
                        .collect()
                })
                .collect(),
            conn.affected_rows(),
            conn.get_warnings(),
        )),
        Err(mysql_async::Error::Server(e)) => Err((e.code, e.state)),
        Err(e) => panic!("{sql}: {e}"),
    }
}

// ---------------------------------------------------------------------------------------
// 3. Grants

#[test]
fn counter_users_get_the_slot_table_and_errors_name_the_logical_table() {
    let db = "hs_con_grants";
    let user = "hs_con_app";
    fresh_db(
        db,
        "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0); \
         INSERT INTO hits VALUES ('a', 1);",
    );
    fresh_user(user);
    mariadb().exec(&format!(
        "GRANT SELECT, UPDATE ON {db}.hits TO '{user}'@'%'"
    ));
    let rule = Rule::counter("page_hits", "hits").toml();
    let d = rules_dir("r.toml", &rule);

    // --print-grants: tables created, the GRANT printed, not run.
    let (code, out, err) = migrate_as_root(d.path(), db, &["--print-grants"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let grant =
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON `{db}`.`hits_slots` TO '{user}'@'%';");
    assert!(out.contains(&grant), "{out}");
    assert!(!out.contains("-- applied: granted"), "{out}");

    // check names the user and what it lacks.
    let (code, out) = check(d.path(), db);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("user '{user}'@'%' may use `{db}`.`hits` but lacks SELECT, INSERT, UPDATE, DELETE on `{db}`.`hits_slots`")),
        "{out}"
    );

    // Through heatsink the statement fails, naming the table the user wrote.
    let env = Env::builder(db).rule("r.toml", rule.clone()).start();
    run(LIMIT, async {
        let mut c = proxied_as(&env, user).await;
        let (code, message) =
            server_error(&mut c, "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a'").await;
        assert_eq!(code, 1142, "{message}");
        assert!(message.contains(&format!("`{db}`.`hits`")), "{message}");
        assert!(!message.contains("hits_slots"), "{message}");
    });

    // A migrate user without the GRANT OPTION says so and changes nothing else.
    let (code, out, err) = migrate(d.path(), db, true);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("-- warning: not granted"), "{out}");

    // migrate --apply grants it; then check passes and the increment works.
    let (code, out, err) = migrate_as_root(d.path(), db, &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(&grant), "{out}");
    assert!(
        out.contains(&format!("-- applied: granted to '{user}'@'%'")),
        "{out}"
    );
    let (code, out) = check(d.path(), db);
    assert_eq!(code, 0, "{out}");
    run(LIMIT, async {
        let mut c = proxied_as(&env, user).await;
        c.query_drop("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a'")
            .await
            .unwrap();
        let n: Option<i64> = c
            .query_first("SELECT cnt FROM hits WHERE slug = 'a'")
            .await
            .unwrap();
        assert_eq!(n, Some(2));
        // Directly, the user still may not touch what the logical table does not allow.
        let mut d = direct_as(db, user).await;
        let (code, _) = server_error(&mut d, "DELETE FROM hits").await;
        assert_eq!(code, 1142);
    });
    // A second run has nothing to grant.
    let (code, out, err) = migrate_as_root(d.path(), db, &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!out.contains("GRANT"), "{out}");
}

#[test]
fn ring_and_rollup_users_get_their_tables() {
    let db = "hs_con_grants_ring";
    let writer = "hs_con_writer";
    let reader = "hs_con_reader";
    fresh_db(
        db,
        "CREATE TABLE ev (id INT AUTO_INCREMENT PRIMARY KEY, uid INT NOT NULL, n INT NOT NULL); \
         CREATE TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at DATETIME, track_id INT);",
    );
    fresh_user(writer);
    fresh_user(reader);
    mariadb().exec(&format!(
        "GRANT INSERT, SELECT ON {db}.ev TO '{writer}'@'%'; \
         GRANT SELECT ON {db}.plays TO '{reader}'@'%'"
    ));
    let rules = format!(
        "{}\n{}",
        Rule::ring("latest", "ev")
            .key(&["uid"])
            .size(2)
            .ring_table("ev_ring")
            .toml(),
        Rule::rollup("plays_daily", "plays", "plays_daily", "created_at", "day")
            .dimensions(&["track_id"])
            .toml()
    );
    let env = Env::builder(db).rule("r.toml", rules).start();
    let (code, out) = check(env.rules_path(), db);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("user '{writer}'@'%' may use `{db}`.`ev` but lacks SELECT, INSERT, UPDATE, DELETE on `{db}`.`ev_ring`")), "{out}");
    assert!(
        out.contains(&format!(
            "user '{reader}'@'%' may use `{db}`.`plays` but lacks SELECT on `{db}`.`plays_daily`"
        )),
        "{out}"
    );
    // The sequence table is only written by the ring's trigger: nothing to grant.
    assert!(
        !out.contains(&format!("on `{db}`.`ev_ring_seq`, which")),
        "{out}"
    );
    let (code, out, err) = migrate_as_root(env.rules_path(), db, &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out) = check(env.rules_path(), db);
    assert_eq!(code, 0, "{out}");
    mariadb().exec(&format!(
        "INSERT INTO {db}.plays (created_at, track_id) VALUES ('2026-11-20 10:00:00', 7)"
    ));
    run(LIMIT, async {
        let mut w = proxied_as(&env, writer).await;
        for n in 1..=3 {
            w.query_drop(format!("INSERT INTO ev (uid, n) VALUES (1, {n})"))
                .await
                .unwrap();
        }
        let got: Vec<i64> = w
            .query("SELECT n FROM ev WHERE uid = 1 ORDER BY id")
            .await
            .unwrap();
        assert_eq!(got, [2, 3]);
        let mut r = proxied_as(&env, reader).await;
        let n: Option<i64> = r
            .query_first("SELECT COUNT(*) AS n FROM plays WHERE track_id = 7 AND created_at >= '2026-11-01' AND created_at < '2026-12-01'")
            .await
            .unwrap();
        assert_eq!(n, Some(1));
    });
}
