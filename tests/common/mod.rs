//! Shared harness for the integration tests.
//!
//! Every test binary that says `mod common;` gets:
//!
//! - [`mariadb()`] → `&'static MariaDb`: a private `mariadbd` started once per test binary
//!   and stopped (data dir removed) when the test process exits, however it exits. It has
//!   the database [`TEST_DB`] (`heatsink_test`), the user [`USER`]/[`PASSWORD`]
//!   (`hs`/`hs-pw`, mysql_native_password), the user [`ED_USER`]/[`ED_PASSWORD`]
//!   (`hs_ed`/`ed-pw`, ed25519), both with ALL on `*.*`, and `root` without a password.
//!   `port()`, `addr()`, `url(db)` (mysql_async, user `hs`), `admin_url(db)`, `exec(sql)`
//!   and `query_strings(sql)` (blocking, as root; usable inside or outside tokio),
//!   `exec_async(sql)`, `error_log()`. [`mariadb_primary()`]: a server with the binary log
//!   on, and [`replica_of`]`(primary)`: a new server replicating from it over loopback
//!   (caught up when returned; [`replica_lag`] reads its `Seconds_Behind_Master`).
//!   [`mariadb_tls()`]: a second server with TLS on,
//!   whose `certs()` ([`TestCerts`], made with the `openssl` CLI) hold a CA, a
//!   certificate for 127.0.0.1/localhost signed by it, its key, and an unrelated CA.
//! - [`Proxy`]: the `heatsink` binary (`serve --listen 127.0.0.1:<free> --backend ..
//!   --rules ..`), by default in front of [`mariadb()`] with an empty rules directory.
//!   `Proxy::start()` or `Proxy::builder().arg(..).rules_dir(..).backend(..).start()`;
//!   `log_level_from(var)`, `listen_arg(flag)`, `start_with_metrics()` and
//!   `start_with_admin()` (those ports on free loopback addresses); `addr()`, `port()`,
//!   `url(db)`, `log_text()`, `stop_graceful()`, `kill9()`. Dropping it sends SIGTERM,
//!   then SIGKILL after 5 s.
//! - [`rawclient`]: `RawClient::connect(addr, &ConnectOpts::new(user, pw).db(..)
//!   .deprecate_eof(..))`, then `query`, `prepare`, `execute`, `execute_with`,
//!   `close_stmt`, `reset_stmt`, `send_long_data`, `ping`, `init_db`, `reset_connection`,
//!   `change_user`, `field_list`, `quit`, `command(raw payload)`; each returns every
//!   response packet (sequence id + payload). It is independent of the proxy's protocol
//!   code and serves as the oracle for byte-level comparisons.
//! - [`packets`]: `Packet::ok()` / `err()` and `parse_ok` / `parse_err` / `parse_eof` /
//!   `parse_column_def` / `parse_text_row`, `describe`, `hex_dump`, `status` flags.
//! - [`client`]: `run(limit, async {..})`, `connect(url)`, `tail`, `rules_dir(file,
//!   toml)` / `rules_dir_with(files)`, `assert_refused_by(conn, sql, rule)`, and
//!   `run_text` / `run_exec` capturing an [`client::Outcome`] (column definitions, rows,
//!   affected rows, info, warnings, last_insert_id).
//! - [`differential`]: `Differential::start(&kind).run(&Config::from_env(..))` runs
//!   seeded statements of a rule [`differential::Kind`] through heatsink and on a plain
//!   reference table, comparing every answer and the logical state (tests/fuzz.rs);
//!   `run_bounded_on(.., Target::Galera)` does so on the Galera cluster.
//! - [`cli`]: `heatsink(args)` and `Cli::new(args).stdin(..).env(..).run()` run the
//!   binary's one-shot subcommands (exit code, stdout, stderr) with a time limit;
//!   `migrate(rules, db, apply)`, `migrate_ok`; `run_limited(cmd, stdin, limit)` (a
//!   [`cli::Ran`]) for other programs, `mariadb_client(..)` and `rule_pymysql(..)`.
//! - [`fixture`]: `fresh_db(db, ddl)`, `fresh_db_with(db, options, ddl)`,
//!   `migrate_apply(db, toml)`; `Rule::counter(..)` / `Rule::ring(..)` / `Rule::rollup(..)` (rule TOML
//!   builders); `Env::builder(db).schema(ddl).rule(file, toml).migrate().metrics()
//!   .admin(pw).log_level_from(var).arg(flag).start()`: one test's database, rules directory
//!   (schema made by `heatsink migrate --apply`) and proxy, with `proxied()`,
//!   `direct()`, `backend_rows`, `metrics()`, `write_rule`, `sighup`, …;
//!   `create_counter_db(db, table_options, rows)` and `counter_rule(name)`: the counter
//!   table and rule several test files share; `counter_value`, `value_of`, `inc_sql`.
//! - [`http_get()`], [`metrics()`] and [`sample()`] for the proxy's HTTP endpoints.
//! - [`free_port()`], [`target_dir()`], [`tests_dir()`].
//!
//! Layout:
//! - `cli.rs`: one-shot runs of the binary.
//! - `client.rs`: mysql_async helpers for the rule tests.
//! - `fixture.rs`: databases, rule TOML and the test environment.
//! - `differential.rs`: the differential fuzzing harness.
//! - `mariadb.rs`: template data directory, server start, watchdog, admin SQL.
//! - `galera.rs`: a 3-node Galera cluster on loopback ([`galera::galera()`]), nodes run as
//!   `mysql`, `kill9()` / `restart()` of a node.
//! - `proxy.rs`: proxy process builder and lifecycle.
//! - `rawclient.rs`: raw protocol client.
//! - `packets.rs`: packet decoders.
//! - `sha1.rs`: SHA-1 for mysql_native_password (kept local so the oracle shares no code
//!   with the proxy).
#![allow(dead_code, unused_imports)]

pub mod cli;
pub mod client;
pub mod differential;
pub mod fixture;
pub mod galera;
mod mariadb;
pub mod packets;
mod proxy;
pub mod rawclient;
mod sha1;

pub use mariadb::{
    mariadb, mariadb_pfs, mariadb_primary, mariadb_tls, replica_lag, replica_of, MariaDb,
    TestCerts, ADMIN_USER, ED_PASSWORD, ED_USER, PASSWORD, TEST_DB, USER,
};
pub use proxy::{http_get, metrics, sample, Proxy, ProxyBuilder};

use std::net::TcpListener;
use std::path::PathBuf;

/// Returns a loopback port that was free a moment ago, for a server a test starts.
///
/// Ports come from below the kernel's ephemeral range (`ip_local_port_range`), so the
/// source port of an outgoing connection (a client, the proxy's backend connections) or
/// another `bind(0)` can never take one between this probe and the server's bind; a port
/// is handed out at most once per test process. Another program on the machine may still
/// take it: callers that start servers retry on "address in use".
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<(u16, HashSet<u16>)>> = Mutex::new(None);

    let (low, high) = fixed_port_range();
    let span = u32::from(high - low);
    let mut guard = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let (next, given) = guard.get_or_insert_with(|| {
        // Start at a place that depends on the process, so that two test binaries (or
        // two checkouts) running at once mostly probe different ports.
        let seed = std::process::id().wrapping_mul(2_654_435_761) ^ clock_nanos();
        (low + (seed % span) as u16, HashSet::new())
    });
    for _ in 0..span {
        let port = *next;
        *next = if *next + 1 >= high { low } else { *next + 1 };
        if given.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    // Everything below the ephemeral range is taken: fall back to the kernel's choice.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr").port()
}

/// The ports `free_port` hands out: from 10000 up to the start of the ephemeral range.
fn fixed_port_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    if ephemeral_low > 12_000 {
        (10_000, ephemeral_low)
    } else {
        // An unusual kernel setting: use the top of the port space instead.
        (61_000, 65_000)
    }
}

fn clock_nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
}

/// Cargo's target directory (the parent of the directory holding the `heatsink` binary).
pub fn target_dir() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_heatsink"));
    bin.parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// The `tests/` directory of the crate.
pub fn tests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// True when the current process runs as root (mariadbd then needs `--user=root`).
pub(crate) fn is_root() -> bool {
    // Avoids a libc dependency: the effective uid is in /proc/self/status ("Uid: r e s f").
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}
