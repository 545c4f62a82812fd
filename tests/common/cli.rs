//! The `heatsink` binary's one-shot subcommands (`check`, `explain`, `migrate`,
//! `compact`, …) as child processes with a time limit, and `heatsink migrate` itself.
//!
//! ```ignore
//! let (code, stdout, stderr) = heatsink(&["check", "--rules", dir]);
//! let (code, out, err) = Cli::new(["explain", "--rules", dir]).stdin("SELECT 1").run();
//! ```

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{mariadb, tests_dir, PASSWORD, USER};

/// How long a subcommand may run before it is killed (and the test fails).
const LIMIT: Duration = Duration::from_secs(60);

/// One run of the `heatsink` binary. `HEATSINK_BACKEND_URL` and `HEATSINK_RULES` are
/// removed from its environment so that only the arguments count.
pub struct Cli {
    cmd: Command,
    stdin: Option<String>,
    limit: Duration,
}

impl Cli {
    /// `heatsink <args…>`.
    pub fn new<I, S>(args: I) -> Cli
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_heatsink"));
        cmd.args(args)
            .env_remove("HEATSINK_BACKEND_URL")
            .env_remove("HEATSINK_RULES");
        Cli {
            cmd,
            stdin: None,
            limit: LIMIT,
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Cli {
        self.cmd.arg(arg);
        self
    }

    /// Sets an environment variable.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Cli {
        self.cmd.env(key, value);
        self
    }

    /// Removes an environment variable.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Cli {
        self.cmd.env_remove(key);
        self
    }

    /// Text written to the process's stdin (default: none, stdin is /dev/null).
    pub fn stdin(mut self, text: impl Into<String>) -> Cli {
        self.stdin = Some(text.into());
        self
    }

    /// Runs the process: (exit code, or -1 on a signal; stdout; stderr).
    pub fn run(mut self) -> (i32, String, String) {
        let stdin = self.stdin.as_deref().map(str::as_bytes);
        let out = run_limited(&mut self.cmd, stdin, self.limit);
        (out.code.unwrap_or(-1), out.stdout, out.stderr)
    }

    /// `heatsink <command…> --rules <rules> --backend-url <url>`: the shape of
    /// every `migrate`, `migrate --revert` and `maintain` run.
    pub fn on(command: &[&str], rules: &Path, url: &str) -> Cli {
        Cli::new(command)
            .arg("--rules")
            .arg(rules)
            .arg("--backend-url")
            .arg(url)
    }

    /// Appends `--name value`.
    pub fn flag(self, name: &str, value: impl ToString) -> Cli {
        self.arg(name).arg(value.to_string())
    }

    /// Appends `--apply`.
    pub fn apply(self) -> Cli {
        self.arg("--apply")
    }

    /// Appends every argument of `args`.
    pub fn args<I, S>(mut self, args: I) -> Cli
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(args);
        self
    }

    /// [`Cli::run`] that must exit 0; returns (stdout, stderr).
    pub fn ok(self) -> (String, String) {
        let (code, out, err) = self.run();
        assert_eq!(code, 0, "heatsink failed:\n{out}\n{err}");
        (out, err)
    }

    /// Starts the process in the background, its stdout and stderr written to the
    /// files `out` and `err` of a directory of its own ([`Running`]).
    pub fn spawn(mut self) -> Running {
        let logs = tempfile::tempdir().expect("a directory for the output");
        let out = std::fs::File::create(logs.path().join("out")).expect("out");
        let err = std::fs::File::create(logs.path().join("err")).expect("err");
        let child = self
            .cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", self.cmd));
        Running { child, logs }
    }
}

/// A `heatsink` run in the background ([`Cli::spawn`]).
pub struct Running {
    pub child: std::process::Child,
    /// Holds the files `out` and `err`.
    pub logs: tempfile::TempDir,
}

impl Running {
    /// What it wrote to `name` (`out` or `err`) so far.
    pub fn output(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.path().join(name)).unwrap_or_default()
    }

    /// Panics with what it printed when it has ended (`why`: what it ended before).
    pub fn assert_alive(&mut self, why: &str) {
        if let Some(status) = self.child.try_wait().expect("wait for child") {
            panic!(
                "heatsink ended ({status}) {why}:\n{}\n{}",
                self.output("out"),
                self.output("err")
            );
        }
    }

    /// Waits until `name` (`out` or `err`) contains `needle`; panics when the
    /// process ends first or after two minutes (a deadline against a hang, not a
    /// timing assert).
    pub fn wait_for(&mut self, name: &str, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.output(name).contains(needle) {
            self.assert_alive(&format!("before printing {needle:?}"));
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in {name}:\n{}",
                self.output(name)
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills it with SIGKILL (by its pid) and reaps it.
    pub fn kill(&mut self) {
        self.child.kill().expect("kill");
        self.child.wait().expect("reap");
    }

    /// Waits for it to end (killing it after four minutes); (exit code, stdout,
    /// stderr).
    pub fn finish(mut self) -> (i32, String, String) {
        let deadline = Instant::now() + Duration::from_secs(240);
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait for child") {
                break s;
            }
            if Instant::now() > deadline {
                self.kill();
                panic!("heatsink did not end");
            }
            thread::sleep(Duration::from_millis(50));
        };
        (
            status.code().unwrap_or(-1),
            self.output("out"),
            self.output("err"),
        )
    }
}

/// `heatsink <args…>`: (exit code, stdout, stderr).
pub fn heatsink(args: &[&str]) -> (i32, String, String) {
    Cli::new(args).run()
}

/// What a finished program printed.
#[derive(PartialEq, Eq)]
pub struct Ran {
    /// The exit code (`None`: ended by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// True when the program exited with 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl std::fmt::Debug for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` with `stdin` (or /dev/null) and captured output; kills it (by its pid)
/// and panics with what it printed so far when it takes longer than `limit`.
pub fn run_limited(cmd: &mut Command, stdin: Option<&[u8]>, limit: Duration) -> Ran {
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    if let Some(data) = stdin {
        let mut pipe = child.stdin.take().expect("piped stdin");
        let data = data.to_vec();
        // A writer thread: a program may print before it has read all of its input.
        thread::spawn(move || {
            let _ = pipe.write_all(&data);
        });
    }
    let reader = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut v = Vec::new();
            let _ = pipe.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("piped stdout")));
    let err = reader(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                out.join().unwrap(),
                err.join().unwrap()
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    Ran {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// `heatsink migrate --rules <rules> --backend-url <db on mariadb()> [--apply]`:
/// (exit code, stdout, stderr).
pub fn migrate(rules: &Path, db: &str, apply: bool) -> (i32, String, String) {
    let cli = Cli::on(&["migrate"], rules, &mariadb().url(db));
    if apply {
        cli.apply().run()
    } else {
        cli.run()
    }
}

/// [`migrate`] that must succeed; returns stdout.
pub fn migrate_ok(rules: &Path, db: &str, apply: bool) -> String {
    let (code, out, err) = migrate(rules, db, apply);
    assert_eq!(code, 0, "migrate failed:\n{out}\n{err}");
    out
}

/// Runs `tests/python/rule_pymysql.py` as the test user against `127.0.0.1:port` in
/// `db` with `statements` (a JSON array on its stdin) and the extra `args`; panics
/// unless it succeeds within 60 s, and returns its stdout.
pub fn rule_pymysql(
    port: u16,
    db: &str,
    table: &str,
    autocommit: bool,
    args: &[&str],
    statements: &[impl AsRef<str>],
) -> String {
    let mut cmd = Command::new("python3");
    cmd.arg(tests_dir().join("python").join("rule_pymysql.py"))
        .arg("--host=127.0.0.1")
        .arg(format!("--port={port}"))
        .arg(format!("--user={USER}"))
        .arg(format!("--password={PASSWORD}"))
        .arg(format!("--db={db}"))
        .arg(format!("--table={table}"))
        .arg(format!("--autocommit={}", u8::from(autocommit)))
        .args(args);
    let statements: Vec<&str> = statements.iter().map(|s| s.as_ref()).collect();
    let input = serde_json::to_string(&statements).expect("statements as JSON");
    let out = run_limited(&mut cmd, Some(input.as_bytes()), LIMIT);
    assert!(out.success(), "rule_pymysql.py failed: {out:?}");
    out.stdout
}

/// The `mariadb` command-line client over TCP to `127.0.0.1:port` as `user` with
/// `args` after the connection options, and `stdin`; fails the test after 30 s.
pub fn mariadb_client(
    port: u16,
    user: &str,
    password: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Ran {
    let mut cmd = Command::new("mariadb");
    cmd.arg("--no-defaults")
        .arg("--protocol=TCP")
        .arg("--host=127.0.0.1")
        .arg(format!("--port={port}"))
        .arg(format!("--user={user}"))
        .arg(format!("--password={password}"))
        .args(args);
    run_limited(&mut cmd, stdin.map(str::as_bytes), Duration::from_secs(30))
}
