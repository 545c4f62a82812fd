//! The lexer's contract end to end (docs/design.md, "The lexer's contract"): the proxy
//! reads a statement on a ruled table the way MariaDB will, under the session's client
//! character set and `sql_mode`, or refuses it with 1105 and changes nothing.
//!
//! Each test has its own database (`lex_<name>`, utf8mb4 tables) and its own proxy
//! with the example counter rule on `hits` (as in tests/counter.rs). Statements are
//! sent with the raw client, byte for byte. A test that changes the server's global
//! `sql_mode` holds [`GLOBAL_MODE`] for writing; the others hold it for reading.

mod common;

use std::sync::RwLock;

use common::fixture::{counter_rule, counter_value, create_counter_db, Env};
use common::packets::Packet;
use common::rawclient::{ConnectOpts, RawClient, RawParam};
use common::{mariadb, PASSWORD, USER};

/// Held for writing while a test changes the server's global `sql_mode`, which every
/// new session starts with.
static GLOBAL_MODE: RwLock<()> = RwLock::new(());

/// The injection of issue 9: inside the string for the proxy's default reading, SQL
/// after the string when 0x5C is not an escape (the second byte of a gbk/sjis
/// character, or NO_BACKSLASH_ESCAPES). Spliced into the counter's slot upsert, it
/// would add a second row that gives `home` (0x686f6d65) 1000.
fn injection(lead: &[u8]) -> Vec<u8> {
    let mut sql = b"UPDATE hits SET cnt = cnt + 1 WHERE slug = '".to_vec();
    sql.extend_from_slice(lead);
    sql.extend_from_slice(b"\\', 0, 1), (0x686f6d65, 3, 1000) -- '");
    sql
}

/// The same trick on a read: a UNION after the string.
fn read_injection(lead: &[u8]) -> Vec<u8> {
    let mut sql = b"SELECT cnt FROM hits WHERE slug = '".to_vec();
    sql.extend_from_slice(lead);
    sql.extend_from_slice(b"\\' UNION SELECT 1000 -- '");
    sql
}

/// Database `lex_<name>` with the counter fixture (utf8mb4, binary collation) and a
/// proxy with the example counter rule.
fn new_env(name: &str) -> Env {
    let db = format!("lex_{name}");
    create_counter_db(
        &db,
        "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        "('home', 10), ('about', 3)",
    );
    Env::builder(db)
        .rule("counter.toml", counter_rule("page_hits"))
        .start()
}

/// What these tests do with an [`Env`]: raw clients and the physical state.
trait LexEnv {
    fn opts(&self) -> ConnectOpts;
    /// A raw client through the proxy.
    fn client(&self) -> RawClient;
    /// A raw client straight to MariaDB.
    fn raw_direct(&self) -> RawClient;
    /// A key's logical value (base plus slot deltas), read directly; `None` when the
    /// key has no row.
    fn value(&self, slug: &str) -> Option<i64>;
    /// Every key, sorted.
    fn keys(&self) -> Vec<String>;
    fn slot_rows(&self) -> usize;
}

impl LexEnv for Env {
    fn opts(&self) -> ConnectOpts {
        ConnectOpts::new(USER, PASSWORD).db(&self.db)
    }

    fn client(&self) -> RawClient {
        RawClient::connect(self.proxy.addr(), &self.opts()).expect("connect through the proxy")
    }

    fn raw_direct(&self) -> RawClient {
        RawClient::connect(mariadb().addr(), &self.opts()).expect("connect to MariaDB")
    }

    fn value(&self, slug: &str) -> Option<i64> {
        counter_value(&self.db, slug)
    }

    fn keys(&self) -> Vec<String> {
        mariadb()
            .query_strings(&format!(
                "SELECT HEX(slug) FROM {}.hits ORDER BY slug",
                self.db
            ))
            .into_iter()
            .filter_map(|r| r.into_iter().next().flatten())
            .collect()
    }

    fn slot_rows(&self) -> usize {
        mariadb().query_strings(&format!("SELECT COUNT(*) FROM {}.hits_slots", self.db))[0][0]
            .as_deref()
            .unwrap_or("0")
            .parse()
            .unwrap_or(0)
    }
}

#[track_caller]
fn ok(packets: &[Packet]) {
    assert!(
        packets.first().is_some_and(|p| p.is_ok()),
        "expected OK, got {packets:?}"
    );
}

/// The error code of a response that must be an error.
#[track_caller]
fn err(packets: &[Packet]) -> (u16, String) {
    let e = packets
        .iter()
        .find_map(|p| p.err())
        .unwrap_or_else(|| panic!("expected an error, got {packets:?}"));
    (e.code, e.message)
}

/// The response was refused by the proxy (1105) with a message containing `what`, or
/// is the error MariaDB itself gives (`direct`).
#[track_caller]
fn refused_or_same(packets: &[Packet], direct: Option<u16>, what: &str) {
    let (code, msg) = err(packets);
    if code == 1105 {
        assert!(msg.starts_with("heatsink rule 'page_hits': "), "{msg}");
        assert!(msg.contains(what), "{msg}");
    } else {
        assert_eq!(Some(code), direct, "{msg}");
    }
}

/// A text row's cells.
fn first_cell(packets: &[Packet]) -> Option<Vec<u8>> {
    // column count, column def, (EOF), row…
    let row = packets
        .iter()
        .skip(2)
        .find(|p| !p.is_eof() && !p.is_ok() && !p.is_err())?;
    common::packets::parse_text_row(&row.payload)?
        .into_iter()
        .next()
        .flatten()
}

#[test]
fn gbk_and_sjis_injections_are_refused() {
    let _g = GLOBAL_MODE.read().unwrap_or_else(|e| e.into_inner());
    let env = new_env("mb");
    for (names, lead) in [("gbk", &b"\xbf"[..]), ("sjis", b"\x95"), ("cp932", b"\x95")] {
        // What MariaDB says about the statement.
        let mut direct = env.raw_direct();
        ok(&direct.query(format!("SET NAMES {names}")).unwrap());
        let (direct_code, _) = err(&direct.query(injection(lead)).unwrap());
        assert_eq!(direct_code, 1064, "{names}");

        let mut c = env.client();
        ok(&c.query(format!("SET NAMES {names}")).unwrap());
        refused_or_same(&c.query(injection(lead)).unwrap(), Some(1064), names);
        refused_or_same(&c.query(read_injection(lead)).unwrap(), Some(1064), names);
        // Even a statement that is fine: the proxy cannot tell under this charset.
        refused_or_same(
            &c.query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
                .unwrap(),
            None,
            names,
        );
        // Statements on other tables are forwarded.
        ok(&c.query("DO 1").unwrap());
    }
    assert_eq!(env.value("home"), Some(10));
    assert_eq!(env.slot_rows(), 0);
}

#[test]
fn handshake_charset_is_learned_from_the_server() {
    let _g = GLOBAL_MODE.read().unwrap_or_else(|e| e.into_inner());
    let env = new_env("hs");
    // 28 = gbk_chinese_ci in the handshake response; classic EOF packets, so the
    // settings query's result ends differently from the other tests'.
    let opts = env.opts().charset(28).deprecate_eof(false);
    let mut c = RawClient::connect(env.proxy.addr(), &opts).unwrap();
    refused_or_same(&c.query(injection(b"\xbf")).unwrap(), Some(1064), "gbk");
    assert_eq!(env.value("home"), Some(10));
    // SET NAMES utf8mb4: rewritten again.
    ok(&c.query("SET NAMES utf8mb4").unwrap());
    ok(&c
        .query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
        .unwrap());
    assert_eq!(env.value("home"), Some(11));
    assert_eq!(env.slot_rows(), 1);
}

#[test]
fn no_backslash_escapes_injection_is_refused() {
    let _g = GLOBAL_MODE.read().unwrap_or_else(|e| e.into_inner());
    let env = new_env("nbe");
    let set = "SET sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')";
    let mut direct = env.raw_direct();
    ok(&direct.query(set).unwrap());
    let (direct_code, _) = err(&direct.query(injection(b"x")).unwrap());
    assert_eq!(direct_code, 1064);

    let mut c = env.client();
    // Learned before this statement: the rewrite reads backslashes as escapes.
    ok(&c
        .query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a\\'b'")
        .unwrap());
    assert_eq!(env.value("a'b"), Some(1));
    ok(&c.query(set).unwrap());
    refused_or_same(&c.query(injection(b"x")).unwrap(), Some(1064), "");
    assert_eq!(env.value("home"), Some(10));
    // The read is a valid UNION under this mode: the same answer as MariaDB's.
    let read = c.query(read_injection(b"x")).unwrap();
    let direct_read = direct.query(read_injection(b"x")).unwrap();
    assert_eq!(first_cell(&read).as_deref(), Some(&b"1000"[..]), "{read:?}");
    assert_eq!(first_cell(&read), first_cell(&direct_read));
    // A backslash is an ordinary character now: the key is `a\b`, as MariaDB reads it.
    ok(&c
        .query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a\\b'")
        .unwrap());
    assert_eq!(env.value("a\\b"), Some(1));
    let read = c.query("SELECT cnt FROM hits WHERE slug = 'a\\b'").unwrap();
    assert_eq!(first_cell(&read).as_deref(), Some(&b"1"[..]), "{read:?}");
    // Prepared statements are read under the mode too.
    let (id, p) = c
        .prepare("UPDATE hits SET cnt = cnt + ? WHERE slug = 'p\\'")
        .unwrap();
    assert!(id != 0, "{p:?}");
    ok(&c.execute(id, &[RawParam::Int(3)]).unwrap());
    assert_eq!(env.value("p\\"), Some(3));
    // And back.
    ok(&c.query("SET sql_mode = DEFAULT").unwrap());
    ok(&c
        .query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a\\\\b'")
        .unwrap());
    assert_eq!(env.value("a\\b"), Some(2));
}

#[test]
fn server_default_no_backslash_escapes_is_seen_by_the_first_session() {
    let _g = GLOBAL_MODE.write().unwrap_or_else(|e| e.into_inner());
    let env = new_env("global");
    let before = mariadb().query_strings("SELECT @@GLOBAL.sql_mode")[0][0]
        .clone()
        .unwrap_or_default();
    let with = if before.is_empty() {
        "NO_BACKSLASH_ESCAPES".to_string()
    } else {
        format!("{before},NO_BACKSLASH_ESCAPES")
    };
    mariadb().exec(&format!("SET GLOBAL sql_mode = '{with}'"));
    let result = std::panic::catch_unwind(|| {
        let mut c = env.client();
        refused_or_same(&c.query(injection(b"x")).unwrap(), Some(1064), "");
        assert_eq!(env.value("home"), Some(10));
        ok(&c
            .query("UPDATE hits SET cnt = cnt + 5 WHERE slug = 'x\\'")
            .unwrap());
        assert_eq!(env.value("x\\"), Some(5));
    });
    mariadb().exec(&format!("SET GLOBAL sql_mode = '{before}'"));
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn ansi_quotes_identifiers() {
    let _g = GLOBAL_MODE.read().unwrap_or_else(|e| e.into_inner());
    let env = new_env("ansi");
    let mut c = env.client();
    ok(&c
        .query("SET sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES')")
        .unwrap());
    ok(&c
        .query(r#"UPDATE "hits" SET "cnt" = "cnt" + 2 WHERE "slug" = 'home'"#)
        .unwrap());
    assert_eq!(env.value("home"), Some(12));
    assert_eq!(env.slot_rows(), 1);
    let read = c
        .query(r#"SELECT "cnt" FROM "hits" WHERE "slug" = 'home'"#)
        .unwrap();
    assert_eq!(first_cell(&read).as_deref(), Some(&b"12"[..]), "{read:?}");
    // `"home"` is a column name now: MariaDB says so, the proxy too.
    let (code, _) = err(&c
        .query(r#"UPDATE hits SET cnt = cnt + 1 WHERE slug = "home""#)
        .unwrap());
    assert!(code == 1105 || code == 1054, "{code}");
    assert_eq!(env.value("home"), Some(12));
}

#[test]
fn latin1_sessions_rewrite_and_charset_changes_are_followed() {
    let _g = GLOBAL_MODE.read().unwrap_or_else(|e| e.into_inner());
    let env = new_env("latin1");
    let mut c = env.client();
    ok(&c.query("SET NAMES latin1").unwrap());
    ok(&c
        .query(&b"UPDATE hits SET cnt = cnt + 1 WHERE slug = 'caf\xe9'"[..])
        .unwrap());
    assert_eq!(env.value("café"), Some(1));
    assert_eq!(env.slot_rows(), 1);
    // gbk: refused; utf8mb4 again: rewritten again.
    ok(&c.query("SET NAMES gbk").unwrap());
    refused_or_same(
        &c.query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
            .unwrap(),
        None,
        "gbk",
    );
    ok(&c.query("/*!40101 SET NAMES utf8mb4 */").unwrap());
    ok(&c
        .query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'caf\u{e9}'")
        .unwrap());
    assert_eq!(env.value("café"), Some(2));
    // SET CHARACTER SET, and a charset changed by a prepared SET.
    ok(&c.query("SET CHARACTER SET sjis").unwrap());
    refused_or_same(&c.query(injection(b"\x95")).unwrap(), Some(1064), "sjis");
    ok(&c.query("SET NAMES utf8mb4").unwrap());
    let (id, p) = c.prepare("SET NAMES gbk").unwrap();
    assert!(id != 0, "{p:?}");
    ok(&c
        .query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
        .unwrap());
    ok(&c.execute(id, &[]).unwrap());
    refused_or_same(&c.query(injection(b"\xbf")).unwrap(), Some(1064), "gbk");
    assert_eq!(env.value("home"), Some(11));
    // A statement that mentions the table (so the settings are learned just before
    // it) and changes them after.
    let mut c = env.client();
    let p = c.query("SELECT 'hits'; SET NAMES gbk").unwrap();
    assert!(!p.iter().any(|p| p.is_err()), "{p:?}");
    refused_or_same(&c.query(injection(b"\xbf")).unwrap(), Some(1064), "gbk");
    assert_eq!(env.value("home"), Some(11));
}

#[test]
fn reset_connection_and_change_user_forget_the_settings() {
    let _g = GLOBAL_MODE.read().unwrap_or_else(|e| e.into_inner());
    let env = new_env("reset");
    let mut c = env.client();
    ok(&c.query("SET NAMES gbk").unwrap());
    refused_or_same(
        &c.query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
            .unwrap(),
        None,
        "gbk",
    );
    ok(&c.reset_connection().unwrap());
    ok(&c
        .query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
        .unwrap());
    assert_eq!(env.value("home"), Some(11));
    // Learned as utf8mb4 again, then the reset brings back a handshake charset of gbk.
    let mut g = RawClient::connect(env.proxy.addr(), &env.opts().charset(28)).unwrap();
    ok(&g.query("SET NAMES utf8mb4").unwrap());
    ok(&g
        .query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
        .unwrap());
    ok(&g.reset_connection().unwrap());
    refused_or_same(&g.query(injection(b"\xbf")).unwrap(), Some(1064), "gbk");
    // COM_CHANGE_USER with the gbk collation as well.
    ok(&c.query("SET NAMES utf8mb4").unwrap());
    ok(&c
        .query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
        .unwrap());
    let mut c = RawClient::connect(env.proxy.addr(), &env.opts().charset(28)).unwrap();
    ok(&c.query("SET NAMES utf8mb4").unwrap());
    ok(&c
        .query("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
        .unwrap());
    let p = c.change_user(USER, PASSWORD, Some(&env.db)).unwrap();
    assert!(p.last().is_some_and(|p| p.is_ok()), "{p:?}");
    refused_or_same(&c.query(injection(b"\xbf")).unwrap(), Some(1064), "gbk");
    assert_eq!(env.value("home"), Some(14));
}

#[test]
fn invalid_utf8_keys_are_refused_and_valid_keys_do_not_collide() {
    let _g = GLOBAL_MODE.read().unwrap_or_else(|e| e.into_inner());
    let env = new_env("utf8");
    let mut c = env.client();
    for bad in [&b"\xff"[..], b"\xfe", b"\xc3", b"a\xe9b"] {
        let mut sql = b"UPDATE hits SET cnt = cnt + 1 WHERE slug = '".to_vec();
        sql.extend_from_slice(bad);
        sql.push(b'\'');
        refused_or_same(&c.query(&sql).unwrap(), None, "not well-formed utf8mb4");
    }
    assert_eq!(env.keys(), vec!["61626F7574", "686F6D65"]);
    // utf8mb3 takes no 4-byte characters.
    ok(&c.query("SET NAMES utf8mb3").unwrap());
    refused_or_same(
        &c.query("UPDATE hits SET cnt = cnt + 1 WHERE slug = '\u{1f600}'")
            .unwrap(),
        None,
        "not well-formed utf8mb3",
    );
    ok(&c.query("SET NAMES utf8mb4").unwrap());
    for key in ["\u{e9}", "\u{e8}", "\u{1f600}", "\u{1f601}"] {
        ok(&c
            .query(format!(
                "UPDATE hits SET cnt = cnt + 1 WHERE slug = '{key}'"
            ))
            .unwrap());
        assert_eq!(env.value(key), Some(1), "{key}");
    }
    assert_eq!(env.keys().len(), 6);
}

#[test]
fn routines_and_server_side_statements_are_followed() {
    let _g = GLOBAL_MODE.read().unwrap_or_else(|e| e.into_inner());
    let env = new_env("routines");
    mariadb().exec(&format!(
        "CREATE PROCEDURE {}.to_gbk() SET NAMES gbk",
        env.db
    ));
    let mut c = env.client();
    let up = "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'";
    ok(&c.query(up).unwrap());
    let p = c.query("CALL to_gbk()").unwrap();
    assert!(!p.iter().any(|p| p.is_err()), "{p:?}");
    // MariaDB restores the caller's character set when the routine ends; whatever
    // it is, the proxy reads the next statement under the same one.
    let cs = first_cell(&c.query("SELECT @@character_set_client").unwrap());
    let what = if cs.as_deref() == Some(&b"gbk"[..]) {
        "gbk"
    } else {
        "not well-formed utf8mb4"
    };
    refused_or_same(&c.query(injection(b"\xbf")).unwrap(), Some(1064), what);
    // SQL-level prepared statements.
    ok(&c.query("SET NAMES utf8mb4").unwrap());
    ok(&c.query("PREPARE s FROM 'SET NAMES sjis'").unwrap());
    ok(&c.query(up).unwrap());
    ok(&c.query("EXECUTE s").unwrap());
    refused_or_same(&c.query(injection(b"\x95")).unwrap(), Some(1064), "sjis");
    ok(&c.query("SET NAMES utf8mb4").unwrap());
    ok(&c
        .query("EXECUTE IMMEDIATE 'SET sql_mode = CONCAT(@@sql_mode, \\',NO_BACKSLASH_ESCAPES\\')'")
        .unwrap());
    refused_or_same(&c.query(injection(b"x")).unwrap(), Some(1064), "");
    ok(&c.query("SET sql_mode = DEFAULT").unwrap());
    // SET STATEMENT … FOR on the ruled table: refused or MariaDB's own answer.
    let p = c
        .query("SET STATEMENT sql_mode = 'NO_BACKSLASH_ESCAPES' FOR UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
        .unwrap();
    if p.iter().any(|p| p.is_err()) {
        refused_or_same(&p, None, "");
        assert_eq!(env.value("home"), Some(12));
    } else {
        assert_eq!(env.value("home"), Some(13));
    }
}

/// The session's `Com_select` counter, read through the proxy (a passthrough).
fn selects(c: &mut RawClient) -> u64 {
    let p = c.query("SHOW SESSION STATUS LIKE 'Com_select'").unwrap();
    // Column count, two definitions (no EOF: DEPRECATE_EOF), the row.
    assert!(c.deprecate_eof());
    let row = p
        .get(3)
        .and_then(|p| common::packets::parse_text_row(&p.payload))
        .expect("a status row");
    String::from_utf8_lossy(row[1].as_deref().unwrap_or_default())
        .parse()
        .expect("a number")
}

#[test]
fn settings_are_queried_once_per_session_and_after_changes() {
    let _g = GLOBAL_MODE.read().unwrap_or_else(|e| e.into_inner());
    let env = new_env("cost");
    let up = "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'";
    // Every slot row of the key exists already: a new one fires the slot trigger,
    // whose duplicate-key check is a SELECT the session's Com_select counts too.
    mariadb().exec(&format!(
        "INSERT INTO {0}.hits_slots (slug, slot, cnt) SELECT 'home', seq, 0 FROM {0}.seq_0_to_255",
        env.db
    ));
    // A first session pays the rule's metadata query too.
    let mut warm = env.client();
    ok(&warm.query(up).unwrap());
    let mut c = env.client();
    let base = selects(&mut c);
    for _ in 0..5 {
        ok(&c.query(up).unwrap());
    }
    ok(&c.query("SET autocommit = 1").unwrap());
    ok(&c.query(up).unwrap());
    // One settings query for six rewritten statements.
    assert_eq!(selects(&mut c), base + 1);
    ok(&c.query("SET NAMES utf8mb4").unwrap());
    ok(&c.query(up).unwrap());
    ok(&c.query(up).unwrap());
    assert_eq!(selects(&mut c), base + 2);
    assert_eq!(env.value("home"), Some(19));
}
