//! A private MariaDB server per test binary.
//!
//! The data directory is copied from a template initialised once under
//! `target/mariadb-template/` (concurrent test binaries race safely: each builds its own
//! candidate and `rename`s it into place; the loser discards its copy).
//!
//! Rust's test harness has no global teardown, so the server runs under a tiny `sh`
//! watchdog whose stdin is a pipe held by the test process. When the test process exits
//! (normally, by panic or by SIGKILL) the pipe closes, `read` returns, and the watchdog
//! stops mariadbd and removes the data directory.

use std::fs;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::cli::run_limited;
use super::{free_port, is_root, target_dir};

/// Database created at start.
pub const TEST_DB: &str = "heatsink_test";
/// mysql_native_password user with ALL on *.*.
pub const USER: &str = "hs";
/// Password of [`USER`].
pub const PASSWORD: &str = "hs-pw";
/// ed25519 user with ALL on *.*.
pub const ED_USER: &str = "hs_ed";
/// Password of [`ED_USER`].
pub const ED_PASSWORD: &str = "ed-pw";
/// Superuser, no password (mysql_native_password), reachable over 127.0.0.1.
pub const ADMIN_USER: &str = "root";

/// Options shared by the template initialisation and the server.
pub(super) const INNODB_OPTS: &[&str] = &[
    "--innodb-buffer-pool-size=128M",
    "--innodb-log-file-size=48M",
];

/// Watchdog: start mariadbd in the background, print its pid, wait for stdin to close,
/// then stop it and delete the data directory. `$1` is the directory to delete, the rest
/// is the mariadbd command line. INT/HUP are ignored so a Ctrl-C on `cargo test` still
/// lets the watchdog clean up once the test process is gone.
pub(super) const WATCHDOG: &str = r#"
dir="$1"; shift
trap '' INT HUP
"$@" </dev/null >/dev/null 2>&1 &
pid=$!
echo "$pid"
read _ignored
kill "$pid" 2>/dev/null
wait "$pid"
rm -rf "$dir"
"#;

/// PEM files for TLS tests, made with the `openssl` CLI in the data directory's parent
/// (removed with the server): a CA, a certificate it signed for `127.0.0.1` and
/// `localhost` (used by the server and by proxies), and an unrelated second CA.
#[derive(Clone, Debug)]
pub struct TestCerts {
    /// The CA that signed `cert`.
    pub ca: PathBuf,
    /// Certificate for 127.0.0.1 / localhost.
    pub cert: PathBuf,
    /// Private key of `cert` (PKCS#8).
    pub key: PathBuf,
    /// A CA that signed nothing here (verification against it fails).
    pub other_ca: PathBuf,
}

impl TestCerts {
    /// Creates the files in `dir`. Panics with openssl's output on failure.
    pub fn create(dir: &Path) -> TestCerts {
        let p = |name: &str| dir.join(name);
        let openssl = |args: &[&str]| {
            let mut cmd = Command::new("openssl");
            cmd.args(args).current_dir(dir);
            let out = run_limited(&mut cmd, None, Duration::from_secs(60));
            assert!(out.success(), "openssl {args:?} failed:\n{}", out.stderr);
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for (name, cn) in [
            ("ca", "heatsink test CA"),
            ("other-ca", "unrelated test CA"),
        ] {
            let (key, pem, subj) = (
                format!("{name}-key.pem"),
                format!("{name}.pem"),
                format!("/CN={cn}"),
            );
            let mut args = vec!["req", "-x509", "-days", "3"];
            args.extend_from_slice(&ec);
            args.extend_from_slice(&[
                "-subj",
                &subj,
                "-keyout",
                &key,
                "-out",
                &pem,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            openssl(&args);
        }
        let mut args = vec!["req", "-new"];
        args.extend_from_slice(&ec);
        args.extend_from_slice(&[
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server-key.pem",
            "-out",
            "server.csr",
        ]);
        openssl(&args);
        fs::write(
            p("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write server.ext");
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-days",
            "3",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ]);
        TestCerts {
            ca: p("ca.pem"),
            cert: p("server.pem"),
            key: p("server-key.pem"),
            other_ca: p("other-ca.pem"),
        }
    }
}

/// A running private mariadbd. Obtain it with [`mariadb()`] or [`mariadb_tls()`].
pub struct MariaDb {
    /// TCP port on 127.0.0.1.
    port: u16,
    /// Directory holding the data dir, socket and error log; removed by the watchdog.
    dir: PathBuf,
    /// mariadbd's pid (a child of the watchdog shell).
    pid: u32,
    /// The server's TLS files, when started with TLS.
    certs: Option<TestCerts>,
    /// Started with performance_schema on (see [`mariadb_pfs()`]).
    performance_schema: bool,
    /// Held open for the life of the process; closing it stops the server.
    _watchdog_stdin: Mutex<ChildStdin>,
    /// The watchdog shell itself (never waited on: it outlives us by design).
    _watchdog: Mutex<Child>,
}

static MARIADB: OnceLock<MariaDb> = OnceLock::new();
/// Whether this binary's [`mariadb()`] starts with `performance_schema` on (set by
/// [`mariadb_pfs()`] before the first start).
static PERFORMANCE_SCHEMA: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
static MARIADB_TLS: OnceLock<MariaDb> = OnceLock::new();

/// Options of a [`mariadb_pfs()`] server: performance_schema on, with the statement
/// history (literal samples per digest) kept.
const PFS_OPTS: &[&str] = &[
    "--performance-schema=ON",
    "--performance-schema-consumer-events-statements-current=ON",
    "--performance-schema-consumer-events-statements-history-long=ON",
    "--performance-schema-events-statements-history-long-size=20000",
    "--performance-schema-digests-size=2000",
];

/// The test binary's MariaDB server, started on first use.
pub fn mariadb() -> &'static MariaDb {
    MARIADB.get_or_init(|| {
        let pfs = PERFORMANCE_SCHEMA.load(std::sync::atomic::Ordering::SeqCst);
        MariaDb::start(false, if pfs { PFS_OPTS } else { &[] })
    })
}

/// The test binary's MariaDB server ([`mariadb()`]) with performance_schema on and the
/// statement history consumers enabled (what `tests/digests.rs` compares with and
/// `heatsink advise --from-performance-schema` reads). A binary that uses it calls it
/// in every test before anything else starts the server; a server already started
/// without performance_schema is a test bug and panics here.
pub fn mariadb_pfs() -> &'static MariaDb {
    PERFORMANCE_SCHEMA.store(true, std::sync::atomic::Ordering::SeqCst);
    let server = mariadb();
    assert!(
        server.performance_schema,
        "mariadb() was started without performance_schema before mariadb_pfs()"
    );
    server
}

static MARIADB_PRIMARY: OnceLock<MariaDb> = OnceLock::new();

/// Options of [`mariadb_primary()`]: the binary log on, so that a replica can follow.
const PRIMARY_OPTS: &[&str] = &[
    "--log-bin=primary-bin",
    "--server-id=1",
    "--binlog-format=MIXED",
];

/// A MariaDB server with the binary log on (`--log-bin`, server id 1), otherwise
/// like [`mariadb()`] (whose server runs without one); started on first use,
/// separate from it. [`replica_of`] starts a replica of it.
pub fn mariadb_primary() -> &'static MariaDb {
    MARIADB_PRIMARY.get_or_init(|| MariaDb::start(false, PRIMARY_OPTS))
}

/// A new private server replicating from `primary` (which has the binary log on,
/// [`mariadb_primary()`]) over loopback as its root user, from the primary's
/// binary log position at this call (the users both servers create at start are
/// not replayed). Returns once the replica runs and has caught up; dropping it
/// stops it and removes its data directory.
pub fn replica_of(primary: &MariaDb) -> MariaDb {
    let replica = MariaDb::start(false, &["--server-id=2"]);
    let status = primary.query_strings("SHOW MASTER STATUS");
    let row = status
        .first()
        .unwrap_or_else(|| panic!("the primary has no binary log (SHOW MASTER STATUS is empty)"));
    let file = row[0].clone().expect("binlog file");
    let pos = row[1].clone().expect("binlog position");
    replica.exec(&format!(
        "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = '{ADMIN_USER}', \
         MASTER_PASSWORD = '', MASTER_LOG_FILE = '{file}', MASTER_LOG_POS = {pos}, \
         MASTER_CONNECT_RETRY = 1, MASTER_USE_GTID = no; START SLAVE",
        primary.port()
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if replica_lag(&replica) == Some(0) {
            return replica;
        }
        assert!(
            Instant::now() < deadline,
            "the replica did not start replicating: {:?}",
            replica.query_strings("SHOW SLAVE STATUS")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `Seconds_Behind_Master` of a replica (`None`: NULL, not replicating).
pub fn replica_lag(replica: &MariaDb) -> Option<u64> {
    let url = replica.admin_url("");
    run_blocking(async move {
        use mysql_async::prelude::Queryable;
        let mut conn = mysql_async::Conn::from_url(url.as_str()).await.ok()?;
        let row: Option<mysql_async::Row> = conn.query_first("SHOW SLAVE STATUS").await.ok()?;
        let _ = conn.disconnect().await;
        row?.get_opt::<Option<u64>, &str>("Seconds_Behind_Master")?
            .ok()
            .flatten()
    })
}

/// A MariaDB server with TLS (`ssl-ca`, `ssl-cert`, `ssl-key` from [`TestCerts`]),
/// otherwise like [`mariadb()`]; started on first use, separate from it.
pub fn mariadb_tls() -> &'static MariaDb {
    MARIADB_TLS.get_or_init(|| MariaDb::start(true, &[]))
}

impl MariaDb {
    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// mysql_async URL for [`USER`] on database `db` (empty = none), TCP only.
    pub fn url(&self, db: &str) -> String {
        url_for(self.addr(), USER, PASSWORD, db)
    }

    /// mysql_async URL for the superuser [`ADMIN_USER`].
    pub fn admin_url(&self, db: &str) -> String {
        url_for(self.addr(), ADMIN_USER, "", db)
    }

    /// Directory holding `data/`, `sock` and `error.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's error log so far.
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }

    /// mariadbd's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The TLS files of a server from [`mariadb_tls()`].
    pub fn certs(&self) -> Option<&TestCerts> {
        self.certs.as_ref()
    }

    /// Runs one or more `;`-separated statements as root. Blocking; callable from inside
    /// or outside a tokio runtime. Panics with the server's error on failure.
    pub fn exec(&self, sql: &str) {
        let url = self.admin_url("");
        let owned = sql.to_string();
        let result = run_blocking(async move {
            use mysql_async::prelude::Queryable;
            let mut conn = mysql_async::Conn::from_url(url.as_str()).await?;
            conn.query_drop(owned.as_str()).await?;
            conn.disconnect().await
        });
        if let Err(e) = result {
            panic!("admin SQL failed: {e}\nSQL: {sql}");
        }
    }

    /// Runs a query as root and returns every row of its (first) result set, each cell
    /// rendered as text (`None` for NULL). Blocking, like [`MariaDb::exec`].
    pub fn query_strings(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        let url = self.admin_url("");
        let owned = sql.to_string();
        let result = run_blocking(async move {
            use mysql_async::prelude::Queryable;
            let mut conn = mysql_async::Conn::from_url(url.as_str()).await?;
            let rows: Vec<mysql_async::Row> = conn.query(owned.as_str()).await?;
            conn.disconnect().await?;
            Ok::<_, mysql_async::Error>(
                rows.into_iter()
                    .map(|row| {
                        row.unwrap()
                            .into_iter()
                            .map(|v| match v {
                                mysql_async::Value::NULL => None,
                                mysql_async::Value::Bytes(b) => {
                                    Some(String::from_utf8_lossy(&b).into_owned())
                                }
                                other => Some(other.as_sql(true)),
                            })
                            .collect()
                    })
                    .collect(),
            )
        });
        result.unwrap_or_else(|e| panic!("admin query failed: {e}\nSQL: {sql}"))
    }

    /// Async variant of [`MariaDb::exec`] for tests that already run on tokio.
    pub async fn exec_async(&self, sql: &str) -> Result<(), mysql_async::Error> {
        use mysql_async::prelude::Queryable;
        let mut conn = mysql_async::Conn::from_url(self.admin_url("").as_str()).await?;
        conn.query_drop(sql).await?;
        conn.disconnect().await
    }

    fn start(tls: bool, extra: &[&str]) -> MariaDb {
        let template = ensure_template();
        let mut last_log = String::new();
        // A free port can be taken between probing and binding: retry a few times.
        for _attempt in 0..4 {
            match Self::try_start(&template, tls, extra) {
                Ok(db) => {
                    db.bootstrap();
                    return db;
                }
                Err(log) => last_log = log,
            }
        }
        panic!("mariadbd did not start; last error log:\n{last_log}");
    }

    /// Starts one server on a fresh copy of the template. `Err` carries the error log.
    fn try_start(template: &Path, tls: bool, extra: &[&str]) -> Result<MariaDb, String> {
        let dir = tempfile::Builder::new()
            .prefix("heatsink-mariadb-")
            .tempdir()
            .expect("create tempdir for mariadbd")
            .keep();
        let data = dir.join("data");
        let status = Command::new("cp")
            .arg("-a")
            .arg(template)
            .arg(&data)
            .status()
            .expect("run cp -a");
        assert!(status.success(), "cp -a {template:?} {data:?} failed");

        let port = free_port();
        let log = dir.join("error.log");
        // A tmpdir of its own: a server starting up deletes every `#sql*` file in
        // its tmpdir, which in a shared /tmp are other servers' live temporary
        // tables (seen as `Error on delete of '/tmp/#sql-temptable-….MAI'`).
        let tmp = dir.join("tmp");
        fs::create_dir_all(&tmp).expect("create the server's tmpdir");
        let mut server: Vec<String> = vec![
            "mariadbd".into(),
            "--no-defaults".into(),
            format!("--datadir={}", data.display()),
            format!("--tmpdir={}", tmp.display()),
            format!("--socket={}", dir.join("sock").display()),
            format!("--pid-file={}", dir.join("mariadbd.pid").display()),
            format!("--log-error={}", log.display()),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--skip-log-bin".into(),
            "--innodb-flush-log-at-trx-commit=2".into(),
            "--max-connections=500".into(),
            "--plugin-load-add=auth_ed25519".into(),
            "--local-infile=1".into(),
            "--max-allowed-packet=64M".into(),
        ];
        server.extend(INNODB_OPTS.iter().map(|s| s.to_string()));
        server.extend(extra.iter().map(|s| s.to_string()));
        let certs = tls.then(|| TestCerts::create(&dir));
        if let Some(c) = &certs {
            server.push(format!("--ssl-ca={}", c.ca.display()));
            server.push(format!("--ssl-cert={}", c.cert.display()));
            server.push(format!("--ssl-key={}", c.key.display()));
        }
        if is_root() {
            server.push("--user=root".into());
        }

        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("heatsink-mariadb-watchdog")
            .arg(&dir)
            .args(&server)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sh watchdog for mariadbd");
        let stdin = watchdog.stdin.take().expect("watchdog stdin");
        let mut stdout = watchdog.stdout.take().expect("watchdog stdout");
        let pid = read_pid_line(&mut stdout);

        let db = MariaDb {
            port,
            dir: dir.clone(),
            pid,
            certs,
            performance_schema: extra.contains(&"--performance-schema=ON"),
            _watchdog_stdin: Mutex::new(stdin),
            _watchdog: Mutex::new(watchdog),
        };
        // On failure `db` is dropped here; statics aside, dropping closes the pipe, so the
        // watchdog cleans up this attempt.
        db.wait_ready(Duration::from_secs(60))?;
        Ok(db)
    }

    /// Waits until the server accepts TCP connections and answers with a greeting.
    fn wait_ready(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(mut s) = TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200))
            {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut first = [0u8; 5];
                // A greeting starts with a 4-byte header then protocol version 10.
                if s.read_exact(&mut first).is_ok() && first[4] == 10 {
                    return Ok(());
                }
            }
            if !process_alive(self.pid) {
                return Err(format!("mariadbd exited early:\n{}", self.error_log()));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "mariadbd not accepting on {} after {limit:?}:\n{}",
                    self.addr(),
                    self.error_log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn bootstrap(&self) {
        self.exec(&format!(
            "CREATE DATABASE IF NOT EXISTS {TEST_DB};
             CREATE USER '{USER}'@'%' IDENTIFIED VIA mysql_native_password USING PASSWORD('{PASSWORD}');
             GRANT ALL ON *.* TO '{USER}'@'%';
             CREATE USER '{ED_USER}'@'%' IDENTIFIED VIA ed25519 USING PASSWORD('{ED_PASSWORD}');
             GRANT ALL ON *.* TO '{ED_USER}'@'%';"
        ));
        // One named time zone with daylight saving time, for sessions that set it.
        let zone = Command::new("mariadb-tzinfo-to-sql")
            .args(["/usr/share/zoneinfo/Europe/Berlin", "Europe/Berlin"])
            .output();
        if let Some(out) = zone
            .ok()
            .filter(|o| o.status.success() && !o.stdout.is_empty())
        {
            self.exec(&format!(
                "USE mysql;\n{}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
    }
}

pub(super) fn url_for(addr: SocketAddr, user: &str, password: &str, db: &str) -> String {
    let auth = if password.is_empty() {
        user.to_string()
    } else {
        format!("{user}:{password}")
    };
    format!("mysql://{auth}@{addr}/{db}?prefer_socket=false")
}

/// Runs a future to completion on a fresh current-thread runtime in its own thread, so it
/// works whether or not the caller is already inside a tokio runtime.
pub(super) fn run_blocking<F, T>(fut: F) -> T
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("build tokio runtime")
            .block_on(fut)
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

pub(super) fn read_pid_line(stdout: &mut impl Read) -> u32 {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).map(|n| n == 1).unwrap_or(false) && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8_lossy(&line)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("watchdog did not print mariadbd's pid: {line:?}"))
}

/// Alive and not a zombie (a dead mariadbd stays a zombie until the watchdog reaps it).
pub(super) fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // Field 3 (after "pid (comm)") is the state.
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// Returns the template data directory, creating it on first use.
pub(super) fn ensure_template() -> PathBuf {
    // The staging directory is named by the process: threads of one test binary
    // that start servers at once (a server and a cluster) must not share it, so
    // one creates the template while the others wait.
    static CREATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _creating = CREATING.lock().unwrap_or_else(|e| e.into_inner());
    let target = target_dir();
    let template = target.join("mariadb-template");
    if template.join("mysql").is_dir() {
        return template;
    }
    fs::create_dir_all(&target).expect("create target dir");
    let staging = target.join(format!("mariadb-template.tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    let mut cmd = Command::new("mariadb-install-db");
    cmd.arg("--no-defaults")
        .arg("--auth-root-authentication-method=normal")
        .arg("--skip-test-db")
        .arg(format!("--datadir={}", staging.display()))
        .args(INNODB_OPTS);
    if is_root() {
        cmd.arg("--user=root");
    }
    let out = cmd.output().expect("run mariadb-install-db");
    if !out.status.success() {
        let _ = fs::remove_dir_all(&staging);
        panic!(
            "mariadb-install-db failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Atomic publish; if another test binary won the race, its template is as good.
    if fs::rename(&staging, &template).is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    assert!(
        template.join("mysql").is_dir(),
        "template {template:?} missing after initialisation"
    );
    template
}
