//! Limits: the maximum client packet, execute parameter counts, the admin port's
//! login errors and throttling, and `EXPLAIN REWRITE` of db-qualified tables.
//!
//! Every answer the proxy gives in place of the server is compared with the answer
//! MariaDB itself gives to the same input.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use common::packets::{parse_err, ErrPacket, Packet};
use common::rawclient::{ConnectOpts, RawClient};
use common::{mariadb, Proxy, PASSWORD, USER};

/// Largest payload of one physical packet.
const MAX_PAYLOAD: usize = 0xFF_FFFF;

/// What a server did with one large COM_QUERY.
#[derive(Debug)]
struct BigOutcome {
    /// The first response packet, if any arrived.
    first: Option<Packet>,
    /// The row's value when the query ran (`LENGTH(…)`).
    value: Option<String>,
    /// The connection still answered a COM_PING afterwards.
    alive: bool,
}

impl BigOutcome {
    fn err(&self) -> Option<ErrPacket> {
        self.first.as_ref().and_then(|p| parse_err(&p.payload))
    }
}

/// Sends `SELECT LENGTH('xxx…')` whose COM_QUERY payload is exactly `payload_len`
/// bytes, framed as the protocol requires (16 MiB - 1 chunks), written from a thread so
/// that a server answering early cannot block the sender; returns the answer and
/// whether the connection survived.
fn big_query(addr: SocketAddr, payload_len: usize) -> BigOutcome {
    let mut c = RawClient::connect(
        addr,
        &ConnectOpts::new(USER, PASSWORD).timeout(Duration::from_secs(120)),
    )
    .expect("connect");
    let head = b"\x03SELECT LENGTH('";
    let tail = b"')";
    assert!(payload_len > head.len() + tail.len());
    let mut w = c.stream().try_clone().expect("clone stream");
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let byte_at = |i: usize| -> u8 {
            if i < head.len() {
                head[i]
            } else if i >= payload_len - tail.len() {
                tail[i - (payload_len - tail.len())]
            } else {
                b'x'
            }
        };
        let mut sent = 0usize;
        let mut seq = 0u8;
        loop {
            let n = (payload_len - sent).min(MAX_PAYLOAD);
            let mut header = (n as u32).to_le_bytes();
            header[3] = seq;
            seq = seq.wrapping_add(1);
            w.write_all(&header)?;
            let mut done = 0;
            while done < n {
                let k = (n - done).min(1 << 20);
                let chunk: Vec<u8> = (sent + done..sent + done + k).map(byte_at).collect();
                w.write_all(&chunk)?;
                done += k;
            }
            sent += n;
            if n < MAX_PAYLOAD {
                return Ok(());
            }
        }
    });
    let first = c.read_packet().ok();
    let mut value = None;
    if first.as_ref().is_some_and(|p| p.payload == [1]) {
        // Column definition, EOF (without DEPRECATE_EOF), the row, the final EOF/OK.
        let _def = c.read_packet().expect("column definition");
        if !c.deprecate_eof() {
            let _eof = c.read_packet().expect("EOF");
        }
        let row = c.read_packet().expect("row");
        value = Some(String::from_utf8_lossy(&row.payload[1..]).into_owned());
        let end = c.read_packet().expect("end of result");
        assert_eq!(end.payload[0], 0xFE, "{end:?}");
    }
    // The sender may fail once the server closed; only the answer matters.
    let _ = writer.join();
    let alive = first.is_some() && ping_ok(&mut c);
    BigOutcome {
        first,
        value,
        alive,
    }
}

fn ping_ok(c: &mut RawClient) -> bool {
    c.stream()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok();
    matches!(c.ping(), Ok(p) if p.first().is_some_and(|p| p.is_ok()))
}

/// The backend's `max_allowed_packet` (the test server starts with 64 MiB).
fn backend_max_packet() -> usize {
    mariadb().query_strings("SELECT @@global.max_allowed_packet")[0][0]
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("max_allowed_packet")
}

/// A process's peak resident set size in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

#[test]
fn oversized_command_is_refused_like_the_server() {
    let max = backend_max_packet();
    let proxy = Proxy::start();
    // Just below the limit: a multi-packet command (four 16 MiB - 1 chunks and a
    // short one) runs; at the limit and far over it: ERR 1153, connection closed.
    for len in [max - 1, max, 200 << 20] {
        let direct = big_query(mariadb().addr(), len);
        let via = big_query(proxy.addr(), len);
        let seqs = (
            direct.first.as_ref().map(|p| p.seq),
            via.first.as_ref().map(|p| p.seq),
        );
        if len < max {
            assert_eq!(direct.value, Some((len - 18).to_string()), "{direct:?}");
            assert_eq!(via.value, direct.value, "{len}");
            assert!(direct.alive && via.alive, "{len}: {direct:?} {via:?}");
        } else {
            let e = direct.err().expect("the server refuses");
            assert_eq!(
                (e.code, e.sqlstate.as_str(), e.message.as_str()),
                (
                    1153,
                    "08S01",
                    "Got a packet bigger than 'max_allowed_packet' bytes"
                )
            );
            assert_eq!(via.err(), Some(e), "{len}");
            assert!(!direct.alive && !via.alive, "{len}: {direct:?} {via:?}");
        }
        assert_eq!(seqs.0, seqs.1, "{len}: sequence ids");
    }
    // The proxy still serves other clients.
    let mut c = RawClient::connect(proxy.addr(), &ConnectOpts::new(USER, PASSWORD)).unwrap();
    assert!(ping_ok(&mut c));
}

#[test]
fn oversized_command_is_not_buffered() {
    let proxy = Proxy::start();
    let pid = proxy.pid().expect("proxy pid");
    let packet = 200 << 20;
    let before = peak_rss(pid);
    let via = big_query(proxy.addr(), packet);
    assert_eq!(via.err().map(|e| e.code), Some(1153), "{via:?}");
    let after = peak_rss(pid);
    // At most the limit (64 MiB) of the command is held; before the limit existed the
    // whole command was buffered, and copied (peak ≈ 2.3 × the packet).
    eprintln!("proxy peak RSS: {before} bytes before, {after} after a {packet}-byte command");
    assert!(
        after < packet / 2,
        "peak RSS {after} bytes for a {packet}-byte command"
    );
}

#[test]
fn configured_client_packet_limit() {
    let limit = 1 << 20;
    let proxy = Proxy::builder()
        .arg("--max-client-packet")
        .arg(limit.to_string())
        .start();
    let pid = proxy.pid().expect("proxy pid");
    let ok = big_query(proxy.addr(), limit - 1);
    assert_eq!(ok.value, Some((limit - 1 - 18).to_string()), "{ok:?}");
    assert!(ok.alive);
    // Refused at the first header, before any of the 40 MiB is read.
    let before = peak_rss(pid);
    let refused = big_query(proxy.addr(), 40 << 20);
    let e = refused.err().expect("refused");
    assert_eq!((e.code, e.sqlstate.as_str()), (1153, "08S01"));
    assert_eq!(refused.first.as_ref().map(|p| p.seq), Some(1));
    assert!(!refused.alive);
    // The peak grows by far less than the refused command (it would grow by at
    // least 40 MiB if the command were read whole); the absolute peak depends on the
    // allocator and the machine, so only the growth is compared.
    let after = peak_rss(pid);
    assert!(
        after < before + (20 << 20),
        "peak RSS {before} → {after} bytes for a refused {}-byte command",
        40 << 20
    );
}

/// A database with the counter rule's tables (`hits`, `hits_slots` and the trigger
/// that creates a logical row), and a rules directory holding the counter rule on
/// the unqualified table `hits`.
fn counter_db(db: &str) -> tempfile::TempDir {
    common::fixture::create_counter_db(db, "", "('home', 10)");
    common::client::rules_dir("counter.toml", &common::fixture::counter_rule("page_hits"))
}

/// COM_STMT_EXECUTE payloads for a statement with two parameters (BIGINT, string),
/// each cut short somewhere, with a name.
fn short_executes(id: u32) -> Vec<(&'static str, Vec<u8>)> {
    let mut head = vec![0x17];
    head.extend_from_slice(&id.to_le_bytes());
    head.push(0);
    head.extend_from_slice(&1u32.to_le_bytes());
    let with = |extra: &[u8]| [head.as_slice(), extra].concat();
    let types = [0x08, 0x00, 0xfd, 0x00];
    let one = 5i64.to_le_bytes();
    vec![
        ("statement id only", head[..5].to_vec()),
        ("no null bitmap", head.clone()),
        ("no new-params-bound flag", with(&[0])),
        ("one parameter type of two", with(&[0, 1, 0x08, 0x00])),
        (
            "one parameter value of two",
            with(&[[0, 1].as_slice(), &types, &one].concat()),
        ),
        (
            "second value cut short",
            with(&[[0, 1].as_slice(), &types, &one, &[5, b'h', b'o']].concat()),
        ),
        ("types never bound", with(&[0, 0])),
    ]
}

#[test]
fn short_execute_of_a_rewritten_statement_is_answered_like_the_server() {
    let db = "lim_exec";
    let rules = counter_db(db);
    let proxy = Proxy::builder().rules_dir(rules.path()).start();
    let opts = ConnectOpts::new(USER, PASSWORD).db(db);
    let mut direct = RawClient::connect(mariadb().addr(), &opts).expect("connect direct");
    let mut via = RawClient::connect(proxy.addr(), &opts).expect("connect proxy");
    let sql = "UPDATE hits SET cnt = cnt + ? WHERE slug = ?";
    for i in 0..short_executes(0).len() {
        let (d_id, d) = direct.prepare(sql).unwrap();
        let (p_id, p) = via.prepare(sql).unwrap();
        assert!(d_id != 0 && p_id != 0, "{d:?} {p:?}");
        let (name, d_cmd) = short_executes(d_id).swap_remove(i);
        let (_, p_cmd) = short_executes(p_id).swap_remove(i);
        let d = direct.command(&d_cmd).unwrap();
        let p = via.command(&p_cmd).unwrap();
        let d_err = d.first().and_then(|p| parse_err(&p.payload));
        let p_err = p.first().and_then(|p| parse_err(&p.payload));
        if name == "second value cut short" {
            // MariaDB runs this with the value cut to the bytes present; the rewrite
            // cannot promise that meaning and refuses it.
            assert!(d_err.is_none(), "{name}: {d:?}");
            let e = p_err.unwrap_or_else(|| panic!("{name}: {p:?}"));
            assert_eq!((e.code, e.sqlstate.as_str()), (1105, "HY000"), "{name}");
            assert!(e.message.starts_with("heatsink rule 'page_hits': "), "{e}");
        } else {
            assert!(d_err.is_some(), "{name}: {d:?}");
            assert_eq!(p_err, d_err, "{name}");
            assert_eq!(p.len(), 1, "{name}: {p:?}");
            assert_eq!(p[0].seq, d[0].seq, "{name}");
        }
        assert!(ping_ok(&mut direct), "{name}: direct connection lost");
        assert!(ping_ok(&mut via), "{name}: proxied connection lost");
    }
    // None of them ran through the rule.
    let slots = mariadb().query_strings(&format!("SELECT COUNT(*) FROM {db}.hits_slots"));
    assert_eq!(slots[0][0].as_deref(), Some("0"));
}

/// The ERR packet a login attempt ends with (panics if it was let in).
fn login_refusal(addr: SocketAddr, user: &str, password: &str) -> Packet {
    use common::rawclient::ConnectError;
    match RawClient::connect(addr, &ConnectOpts::new(user, password)) {
        Err(ConnectError::Rejected { packets, .. }) => packets.last().cloned().expect("ERR"),
        Err(e) => panic!("{user}@{addr}: {e}"),
        Ok(_) => panic!("{user}@{addr} was let in with password {password:?}"),
    }
}

/// A proxy with an admin port (password `adm-pw`); returns it and the admin address.
fn admin_proxy() -> (Proxy, SocketAddr) {
    Proxy::builder()
        .arg("--admin-password")
        .arg("adm-pw")
        .start_with_admin()
}

#[test]
fn admin_login_refusal_is_the_servers_access_denied() {
    let (_proxy, admin) = admin_proxy();
    let direct = login_refusal(mariadb().addr(), USER, "wrong");
    let via = login_refusal(admin, "admin", "wrong");
    let d = parse_err(&direct.payload).expect("server ERR");
    let v = parse_err(&via.payload).expect("admin ERR");
    assert_eq!((d.code, d.sqlstate.as_str()), (1045, "28000"), "{d}");
    assert_eq!((v.code, v.sqlstate.as_str()), (1045, "28000"), "{v}");
    assert_eq!(via.seq, direct.seq);
    // The same message, but for the user and host.
    let shape = |m: &str, user: &str| {
        let rest = m
            .strip_prefix(&format!("Access denied for user '{user}'@'"))
            .unwrap_or_else(|| panic!("{m}"));
        rest[rest.find('\'').expect("host end")..].to_string()
    };
    assert_eq!(shape(&v.message, "admin"), shape(&d.message, USER));
    assert_eq!(
        v.message,
        "Access denied for user 'admin'@'127.0.0.1' (using password: YES)"
    );
    // A wrong user gets the same answer; no password says so.
    let v = parse_err(&login_refusal(admin, "root", "").payload).unwrap();
    let d = parse_err(&login_refusal(mariadb().addr(), USER, "").payload).unwrap();
    assert_eq!((v.code, v.sqlstate.as_str()), (d.code, d.sqlstate.as_str()));
    assert!(v.message.ends_with("(using password: NO)"), "{v}");
    assert!(d.message.ends_with("(using password: NO)"), "{d}");
}

#[test]
fn admin_login_failures_are_throttled_then_locked_out() {
    let (_proxy, admin) = admin_proxy();
    // Each failure is answered later than the one before (25 ms, doubling).
    let mut took = Vec::new();
    for _ in 0..6 {
        let started = std::time::Instant::now();
        let e = parse_err(&login_refusal(admin, "admin", "guess").payload).unwrap();
        assert_eq!(e.code, 1045);
        took.push(started.elapsed());
    }
    assert!(took[5] >= Duration::from_millis(800), "{took:?}");
    // Six failures: the address is refused before the greeting, even with the right
    // password, with the server's "host blocked" error.
    let mut s = std::net::TcpStream::connect(admin).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut bytes = Vec::new();
    use std::io::Read;
    s.read_to_end(&mut bytes).unwrap();
    assert!(bytes.len() > 4 && bytes[3] == 0, "{bytes:?}");
    let e = parse_err(&bytes[4..]).expect("ERR instead of a greeting");
    assert_eq!((e.code, e.sqlstate.as_str()), (1129, "HY000"), "{e}");
    assert!(e.message.contains("blocked"), "{e}");
    use common::rawclient::ConnectError;
    assert!(matches!(
        RawClient::connect(admin, &ConnectOpts::new("admin", "adm-pw")),
        Err(ConnectError::Io(_))
    ));
}

#[test]
fn admin_login_success_clears_failures() {
    let (_proxy, admin) = admin_proxy();
    for _ in 0..2 {
        for _ in 0..5 {
            login_refusal(admin, "admin", "guess");
        }
        // Five failures, then the right password: in, and the count starts again.
        RawClient::connect(admin, &ConnectOpts::new("admin", "adm-pw")).expect("login");
    }
}

/// The rows of an admin command, as text.
fn admin_rows(c: &mut RawClient, sql: &str) -> Vec<Vec<String>> {
    use common::packets::parse_text_row;
    let packets = c.query(sql).expect("admin query");
    if let Some(e) = packets.first().and_then(|p| parse_err(&p.payload)) {
        panic!("{sql}: {e}");
    }
    let columns = packets[0].payload[0] as usize;
    let skip = 1 + columns + usize::from(!c.deprecate_eof());
    packets[skip..packets.len() - 1]
        .iter()
        .map(|p| {
            parse_text_row(&p.payload)
                .expect("text row")
                .into_iter()
                .map(|v| String::from_utf8_lossy(&v.unwrap_or_default()).into_owned())
                .collect()
        })
        .collect()
}

#[test]
fn explain_rewrite_resolves_db_qualified_tables_without_use() {
    let db = "lim_explain";
    let rules = counter_db(db);
    let admin = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let proxy = Proxy::builder()
        .rules_dir(rules.path())
        .arg("--admin")
        .arg(admin.to_string())
        .arg("--admin-password")
        .arg("adm-pw")
        .start();
    let mut a = RawClient::connect(admin, &ConnectOpts::new("admin", "adm-pw")).expect("admin");
    let explain = |a: &mut RawClient, sql: &str| {
        admin_rows(a, &format!("EXPLAIN REWRITE '{}'", sql.replace('\'', "''")))
    };
    let update = format!("UPDATE {db}.hits SET cnt = cnt + 1 WHERE slug = 'home'");
    let read = format!("SELECT cnt FROM {db}.hits WHERE slug = 'home'");
    // No client used the table yet: the proxy does not know its columns.
    let rows = explain(&mut a, &update);
    assert_eq!(rows[0][..2], ["needs_metadata", "page_hits"], "{rows:?}");
    // Clients without a default database, or with another one, use the qualified
    // table: the rule learns `lim_explain`'s columns and rewrites.
    for default_db in [None, Some("mysql")] {
        let mut opts = ConnectOpts::new(USER, PASSWORD);
        if let Some(d) = default_db {
            opts = opts.db(d);
        }
        let mut c = RawClient::connect(proxy.addr(), &opts).unwrap();
        for sql in [&update, &read] {
            let r = c.query(sql).unwrap();
            assert!(
                r.first().is_some_and(|p| parse_err(&p.payload).is_none()),
                "{default_db:?}: {sql}: {:?}",
                r.first().and_then(|p| parse_err(&p.payload))
            );
        }
    }
    let slots = mariadb().query_strings(&format!("SELECT SUM(cnt) FROM {db}.hits_slots"));
    assert_eq!(slots[0][0].as_deref(), Some("2"));
    // The admin port, without USE, explains both.
    for sql in [&update, &read] {
        let rows = explain(&mut a, sql);
        assert_eq!(rows[0][..2], ["rewrite", "page_hits"], "{sql}: {rows:?}");
        let text: String = rows.iter().map(|r| r[2].as_str()).collect();
        assert!(text.contains(&format!("{db}.")), "{text}");
        assert!(text.contains("hits_slots"), "{text}");
    }
}
