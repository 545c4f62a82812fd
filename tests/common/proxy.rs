//! The `heatsink` binary as a child process.
//!
//! ```ignore
//! let proxy = Proxy::builder().arg("--log-level").arg("debug").start();
//! let mut c = RawClient::connect(proxy.addr(), &ConnectOpts::new(USER, PASSWORD))?;
//! ```
//!
//! Drop sends SIGTERM, waits up to 5 s, then SIGKILLs.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, mariadb, PASSWORD, USER};

/// How long to wait for the listener before giving up.
const START_LIMIT: Duration = Duration::from_secs(20);
/// How long Drop waits after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);

/// Configures a proxy process; see [`Proxy::builder`].
#[derive(Default)]
pub struct ProxyBuilder {
    /// `--backend`; default: the test binary's MariaDB.
    backend: Option<String>,
    /// `--rules`; default: a fresh empty directory (pure passthrough).
    rules: Option<PathBuf>,
    /// No `--rules` at all (and no `HEATSINK_RULES`): the binary's own default.
    no_rules: bool,
    /// Working directory of the process; default: the test's.
    current_dir: Option<PathBuf>,
    /// `--listen` port; default: a free port.
    port: Option<u16>,
    /// Extra arguments appended after the standard ones.
    args: Vec<OsString>,
    /// Extra environment variables (e.g. `RUST_LOG`).
    envs: Vec<(OsString, OsString)>,
}

impl ProxyBuilder {
    /// Appends one command-line argument after `serve --listen .. --backend .. --rules ..`.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// `--rules PATH` (a file or a directory of *.toml).
    pub fn rules_dir(mut self, path: impl AsRef<Path>) -> Self {
        self.rules = Some(path.as_ref().to_path_buf());
        self
    }

    /// Starts the proxy without `--rules` (and without `HEATSINK_RULES` in its
    /// environment), so it runs with the binary's default.
    pub fn no_rules(mut self) -> Self {
        self.no_rules = true;
        self
    }

    /// Runs the proxy in `dir` (e.g. a directory that has a `rules/` of its own).
    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.current_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// `--backend ADDR` (default: [`mariadb()`]).
    pub fn backend(mut self, addr: impl ToString) -> Self {
        self.backend = Some(addr.to_string());
        self
    }

    /// Listen on this port instead of a free one (e.g. to restart on the same address).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Sets an environment variable for the proxy process.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// `--log-level <value>` when the environment variable `var` is set (for example
    /// `RING_PROXY_LOG=debug` while debugging a test).
    pub fn log_level_from(self, var: &str) -> Self {
        match std::env::var(var) {
            Ok(level) => self.arg("--log-level").arg(level),
            Err(_) => self,
        }
    }

    /// Appends `flag <127.0.0.1:free port>` (`--metrics`, `--admin`) and returns that
    /// address too.
    pub fn listen_arg(self, flag: &str) -> (Self, SocketAddr) {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        (self.arg(flag).arg(addr.to_string()), addr)
    }

    /// [`ProxyBuilder::start`] with `--metrics` on a free loopback port; returns the
    /// proxy and that address.
    pub fn start_with_metrics(self) -> (Proxy, SocketAddr) {
        let (builder, addr) = self.listen_arg("--metrics");
        (builder.start(), addr)
    }

    /// [`ProxyBuilder::start`] with `--admin` on a free loopback port; returns the
    /// proxy and that address.
    pub fn start_with_admin(self) -> (Proxy, SocketAddr) {
        let (builder, addr) = self.listen_arg("--admin");
        (builder.start(), addr)
    }

    /// Spawns the proxy and waits until its listen port accepts connections. Panics with
    /// the proxy's log if it exits or does not listen within 20 s.
    pub fn start(self) -> Proxy {
        let dir = tempfile::Builder::new()
            .prefix("heatsink-proxy-")
            .tempdir()
            .expect("create proxy tempdir");
        let rules = match self.rules {
            Some(r) => r,
            None => {
                let r = dir.path().join("rules");
                fs::create_dir(&r).expect("create empty rules dir");
                r
            }
        };
        let backend = self.backend.unwrap_or_else(|| mariadb().addr().to_string());
        let log_path = dir.path().join("proxy.log");
        // A port chosen here can still be taken by another program before the proxy
        // binds it; then start again on another one (unless the caller chose the port).
        let attempts = if self.port.is_some() { 1 } else { 4 };
        let mut proxy = None;
        for attempt in 1..=attempts {
            let port = self.port.unwrap_or_else(free_port);
            let listen = SocketAddr::from(([127, 0, 0, 1], port));
            let log = fs::File::create(&log_path).expect("create proxy log");
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_heatsink"));
            cmd.arg("serve")
                .arg("--listen")
                .arg(listen.to_string())
                .arg("--backend")
                .arg(&backend);
            if self.no_rules {
                cmd.env_remove("HEATSINK_RULES");
            } else {
                cmd.arg("--rules").arg(&rules);
            }
            if let Some(d) = &self.current_dir {
                cmd.current_dir(d);
            }
            cmd.args(&self.args)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone log handle"))
                .stderr(log);
            for (k, v) in &self.envs {
                cmd.env(k, v);
            }
            let child = cmd.spawn().expect("spawn heatsink");
            let mut started = Proxy {
                child: Some(child),
                addr: listen,
                log_path: log_path.clone(),
                _dir: None,
            };
            match started.wait_listening() {
                Ok(()) => {
                    proxy = Some(started);
                    break;
                }
                Err(log) if attempt < attempts && log.contains(&format!("binding {listen}")) => {
                    eprintln!("proxy port {port} was taken before heatsink bound it; retrying");
                }
                Err(log) => panic!("{log}"),
            }
        }
        let mut proxy = proxy.expect("the last attempt panics on failure");
        proxy._dir = Some(dir);
        proxy
    }
}

/// A running `heatsink serve` process.
pub struct Proxy {
    /// `None` once stopped.
    child: Option<Child>,
    /// The `--listen` address.
    addr: SocketAddr,
    /// stdout and stderr of the process.
    log_path: PathBuf,
    /// Holds the log and default rules directory until the proxy is dropped.
    _dir: Option<tempfile::TempDir>,
}

impl Proxy {
    /// A builder with the defaults: backend = [`mariadb()`], empty rules dir, free port.
    pub fn builder() -> ProxyBuilder {
        ProxyBuilder::default()
    }

    /// A passthrough proxy in front of [`mariadb()`].
    pub fn start() -> Proxy {
        Self::builder().start()
    }

    /// The listen address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The listen port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// mysql_async URL for the test user through the proxy (`db` empty = none).
    pub fn url(&self, db: &str) -> String {
        format!(
            "mysql://{USER}:{PASSWORD}@{}/{db}?prefer_socket=false",
            self.addr
        )
    }

    /// Process id (None once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Everything the proxy wrote to stdout/stderr so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Path of the log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Sends SIGTERM and waits for the exit (up to 60 s, then SIGKILL and panic).
    pub fn stop_graceful(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("proxy already stopped");
        send_signal(child.id(), "TERM");
        match wait_timeout(&mut child, Duration::from_secs(60)) {
            Some(status) => status,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "proxy did not exit within 60 s of SIGTERM; log:\n{}",
                    self.log_text()
                );
            }
        }
    }

    /// SIGKILL, no grace; returns once the process is gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Exit status if the process has already exited, without waiting.
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits until the listen port accepts connections; `Err` carries a message with the
    /// proxy's log when it exited first or did not listen within [`START_LIMIT`].
    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Some(status) = self.try_exit_status() {
                self.child = None;
                return Err(format!(
                    "heatsink exited before listening on {} ({status}); log:\n{}",
                    self.addr,
                    self.log_text()
                ));
            }
            if Instant::now() >= deadline {
                self.kill9();
                return Err(format!(
                    "heatsink not listening on {} after {START_LIMIT:?}; log:\n{}",
                    self.addr,
                    self.log_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                send_signal(child.id(), "TERM");
                if wait_timeout(&mut child, TERM_GRACE).is_none() {
                    let _ = child.kill();
                }
            }
            let _ = child.wait();
        }
    }
}

fn send_signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `GET path` on `addr` (HTTP/1.1, `Connection: close`): (status code, body). Retries
/// the connection for 10 s (an endpoint binds just after the proxy's listener).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("connect {addr}: {e}"),
        }
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut resp = String::new();
    stream.read_to_string(&mut resp).expect("read response");
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("bad HTTP response: {resp:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad HTTP response: {resp:?}"));
    (status, body.to_string())
}

/// The value of the series `series` (the exact name, labels included) in a `/metrics`
/// body; `None` when absent. Panics when its value is not a number.
pub fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|e| panic!("{series} = {v:?}: {e}"))
        })
}

/// GETs `/metrics` and returns every unlabelled sample.
pub fn metrics(addr: SocketAddr) -> HashMap<String, u64> {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "metrics answer: {body}");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, v) = l.split_once(' ')?;
            Some((name.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}
