//! What the rule tests set up: fresh databases, rule TOML, and one test environment
//! (a database, a rules directory, the schema `heatsink migrate --apply` creates, and a
//! proxy, with a metrics endpoint and an admin port when asked).
//!
//! ```ignore
//! let env = Env::builder("ctr_text")
//!     .schema("CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL);")
//!     .rule("counter.toml", &Rule::counter("page_hits", "hits").toml())
//!     .migrate()
//!     .metrics()
//!     .start();
//! let mut conn = env.proxied().await;
//! ```

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use mysql_async::prelude::*;
use mysql_async::Conn;

use super::cli::migrate_ok;
use super::client::{connect, rules_dir, rules_dir_with, tail};
use super::{mariadb, metrics, Proxy};

/// Creates database `db` afresh (dropping it first) and runs `ddl` in it.
pub fn fresh_db(db: &str, ddl: &str) {
    fresh_db_with(db, "", ddl);
}

/// [`fresh_db`] with `options` on CREATE DATABASE (for example a character set).
pub fn fresh_db_with(db: &str, options: &str, ddl: &str) {
    let mut sql = format!("DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db} {options}");
    if !ddl.trim().is_empty() {
        sql.push_str(&format!("; USE {db}; {ddl}"));
    }
    mariadb().exec(&sql);
}

/// The first value of a query run as root directly on MariaDB (`None`: no row, or NULL).
pub fn scalar(sql: &str) -> Option<String> {
    mariadb()
        .query_strings(sql)
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next().flatten())
}

/// True when `db.table` exists.
pub fn table_exists(db: &str, table: &str) -> bool {
    scalar(&format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = '{table}'"
    ))
    .as_deref()
        == Some("1")
}

/// Runs `heatsink migrate --apply` in `db` for the rules in `toml` (written to a
/// temporary rules directory); returns migrate's stdout.
pub fn migrate_apply(db: &str, toml: &str) -> String {
    let rules = rules_dir("migrate.toml", toml);
    migrate_ok(rules.path(), db, true)
}

// ---------------------------------------------------------------------------------------
// Rule TOML

/// One `[[counter]]`, `[[ring]]`, `[[rollup]]` or `[[partition]]` rule, written as TOML by [`Rule::toml`] (one
/// `key = value` line per setting, in the order they were first set).
#[derive(Clone, Debug)]
pub struct Rule {
    kind: &'static str,
    settings: Vec<(&'static str, String)>,
}

/// A TOML string.
fn quoted(s: &str) -> String {
    format!("\"{s}\"")
}

/// A TOML array of strings.
fn list(items: &[&str]) -> String {
    let items: Vec<String> = items.iter().map(|s| quoted(s)).collect();
    format!("[{}]", items.join(", "))
}

impl Rule {
    /// A counter rule on `table` with the usual shape: key `slug`, counter `cnt`,
    /// 16 slots, slot table `hits_slots`.
    pub fn counter(name: &str, table: &str) -> Rule {
        Rule {
            kind: "counter",
            settings: vec![("name", quoted(name)), ("table", quoted(table))],
        }
        .key(&["slug"])
        .columns(&["cnt"])
        .slots(16)
        .slot_table("hits_slots")
    }

    /// A ring rule on the log `table`; its key, size, ring table and the rest are set
    /// with the other methods, in the order they should appear.
    pub fn ring(name: &str, table: &str) -> Rule {
        Rule {
            kind: "ring",
            settings: vec![("name", quoted(name)), ("table", quoted(table))],
        }
    }

    /// A rollup rule on the log `table` into `rollup_table`, time column `time`,
    /// bucket `bucket` (`hour`/`day`); dimensions and measures with the methods below.
    pub fn rollup(name: &str, table: &str, rollup_table: &str, time: &str, bucket: &str) -> Rule {
        Rule {
            kind: "rollup",
            settings: vec![
                ("name", quoted(name)),
                ("table", quoted(table)),
                ("rollup_table", quoted(rollup_table)),
                ("time", quoted(time)),
                ("bucket", quoted(bucket)),
            ],
        }
    }

    /// A partition rule on `table` with the issue's shape: key `UUID` carrying unix
    /// seconds between dashes, partition column `Inserted`, retention 30 days, premake
    /// 3, tolerance 1; change settings with [`Rule::set`].
    pub fn partition(name: &str, table: &str) -> Rule {
        Rule {
            kind: "partition",
            settings: vec![
                ("name", quoted(name)),
                ("table", quoted(table)),
                ("key", quoted("UUID")),
                ("key_time", quoted("unix")),
                ("key_pattern", quoted("-([0-9]{10})-")),
                ("column", quoted("Inserted")),
                ("period", quoted("day")),
                ("retention_days", "30".into()),
                ("premake", "3".into()),
                ("tolerance_days", "1".into()),
            ],
        }
    }

    /// A pull timeline rule over the usual `message (id, user_id, body)` and
    /// `follower (user_id, follower_id)` tables.
    pub fn timeline(name: &str) -> Rule {
        Rule {
            kind: "timeline",
            settings: vec![
                ("name", quoted(name)),
                ("messages", quoted("message")),
                ("message_author", quoted("user_id")),
                ("follows", quoted("follower")),
                ("follow_reader", quoted("user_id")),
                ("follow_author", quoted("follower_id")),
                ("mode", quoted("pull")),
            ],
        }
    }

    /// `dimensions = [..]` (rollup).
    pub fn dimensions(self, columns: &[&str]) -> Rule {
        self.set("dimensions", list(columns))
    }

    /// `measures = [..]` (rollup).
    pub fn measures(self, measures: &[&str]) -> Rule {
        self.set("measures", list(measures))
    }

    /// Sets `key` to the TOML value `value` (replacing it in place when already set).
    pub fn set(mut self, key: &'static str, value: impl Into<String>) -> Rule {
        let value = value.into();
        match self.settings.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.settings.push((key, value)),
        }
        self
    }

    /// Removes the setting `key`.
    pub fn without(mut self, key: &str) -> Rule {
        self.settings.retain(|(k, _)| *k != key);
        self
    }

    /// `key = [..]`.
    pub fn key(self, columns: &[&str]) -> Rule {
        self.set("key", list(columns))
    }

    /// `columns = [..]` (counter).
    pub fn columns(self, columns: &[&str]) -> Rule {
        self.set("columns", list(columns))
    }

    /// `slots = n` (counter).
    pub fn slots(self, n: u32) -> Rule {
        self.set("slots", n.to_string())
    }

    /// `slot_table = ".."` (counter).
    pub fn slot_table(self, table: &str) -> Rule {
        self.set("slot_table", quoted(table))
    }

    /// `size = n` (ring).
    pub fn size(self, n: usize) -> Rule {
        self.set("size", n.to_string())
    }

    /// `ring_table = ".."` (ring).
    pub fn ring_table(self, table: &str) -> Rule {
        self.set("ring_table", quoted(table))
    }

    /// `seq_table = ".."` (ring).
    pub fn seq_table(self, table: &str) -> Rule {
        self.set("seq_table", quoted(table))
    }

    /// `order_by = ".."` (ring).
    pub fn order_by(self, column: &str) -> Rule {
        self.set("order_by", quoted(column))
    }

    /// `coalesce = ..`.
    pub fn coalesce(self, on: bool) -> Rule {
        self.set("coalesce", on.to_string())
    }

    /// The rule as TOML.
    pub fn toml(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "[[{}]]", self.kind)?;
        for (k, v) in &self.settings {
            writeln!(f, "{k} = {v}")?;
        }
        Ok(())
    }
}

/// The counter rule `name` on table `hits` (unqualified), key `slug`, 4 slots.
pub fn counter_rule(name: &str) -> String {
    Rule::counter(name, "hits").slots(4).toml()
}

/// Creates database `db` afresh with `hits (slug VARCHAR(64) PRIMARY KEY, cnt INT)` with
/// `table_options` (for example a character set and collation), inserts `rows` into it
/// (`('home', 10), …`), and creates `hits_slots` and its trigger with
/// `heatsink migrate --apply` for [`counter_rule`].
pub fn create_counter_db(db: &str, table_options: &str, rows: &str) {
    fresh_db_with(
        db,
        "CHARACTER SET utf8mb4",
        &format!(
            "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0) {table_options};
             INSERT INTO hits VALUES {rows};"
        ),
    );
    migrate_apply(db, &counter_rule("hits"));
}

/// A counter's logical value (base plus slot deltas) in `db.hits` (slot table
/// `hits_slots`), read directly on MariaDB; `None` when the key has no row. The key is
/// sent as hex, so the root session's sql_mode does not matter.
pub fn counter_value(db: &str, slug: &str) -> Option<i64> {
    let hex: String = slug.bytes().map(|b| format!("{b:02X}")).collect();
    mariadb()
        .query_strings(&format!(
            "SELECT h.cnt + COALESCE((SELECT SUM(s.cnt) FROM {db}.hits_slots s WHERE s.slug = h.slug), 0)
             FROM {db}.hits h WHERE h.slug = CONVERT(X'{hex}' USING utf8mb4)"
        ))
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next().flatten())
        .map(|v| v.parse().expect("a number"))
}

/// A counter's value in `hits`, read with a prepared statement on `conn`.
pub async fn value_of(conn: &mut Conn, slug: &str) -> Option<i64> {
    conn.exec_first("SELECT cnt FROM hits WHERE slug = ?", (slug,))
        .await
        .unwrap_or_else(|e| panic!("read {slug}: {e}"))
}

/// Text-protocol increment `UPDATE hits SET cnt = cnt + d WHERE slug = '<slug>'`.
pub fn inc_sql(slug: &str, d: i64) -> String {
    format!("UPDATE hits SET cnt = cnt + {d} WHERE slug = '{slug}'")
}

/// The info text of an UPDATE that changed one row.
pub const MATCHED_1: &str = "Rows matched: 1  Changed: 1  Warnings: 0";

// ---------------------------------------------------------------------------------------
// One test's environment

/// Configures an [`Env`]; see [`Env::builder`].
pub struct EnvBuilder {
    db: String,
    schema: Option<String>,
    files: Vec<(String, String)>,
    migrate: bool,
    migrate_rules: Vec<String>,
    metrics: bool,
    admin_password: Option<String>,
    log_level_var: Option<String>,
    args: Vec<String>,
}

impl EnvBuilder {
    /// Creates the database afresh with `ddl` (default: the database is left as it is).
    pub fn schema(mut self, ddl: impl Into<String>) -> Self {
        self.schema = Some(ddl.into());
        self
    }

    /// A file of the proxy's rules directory.
    pub fn rule(mut self, file: &str, toml: impl Into<String>) -> Self {
        self.files.push((file.to_string(), toml.into()));
        self
    }

    /// Runs `heatsink migrate --apply` for the rules directory before the proxy starts.
    pub fn migrate(mut self) -> Self {
        self.migrate = true;
        self
    }

    /// Runs `heatsink migrate --apply` for `toml` (which the proxy does not get), for
    /// tests that add their rules later.
    pub fn migrate_rule(mut self, toml: impl Into<String>) -> Self {
        self.migrate_rules.push(toml.into());
        self
    }

    /// Starts the proxy with `--metrics` on a free loopback port.
    pub fn metrics(mut self) -> Self {
        self.metrics = true;
        self
    }

    /// Starts the proxy with `--admin` on a free loopback port and this password
    /// (`HEATSINK_ADMIN_PASSWORD`).
    pub fn admin(mut self, password: &str) -> Self {
        self.admin_password = Some(password.to_string());
        self
    }

    /// The environment variable whose value, when set, is the proxy's `--log-level`.
    pub fn log_level_from(mut self, var: &str) -> Self {
        self.log_level_var = Some(var.to_string());
        self
    }

    /// One more argument of `heatsink serve` (after the harness's own).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Sets up the database and the rules, then starts the proxy.
    pub fn start(self) -> Env {
        if let Some(ddl) = &self.schema {
            fresh_db(&self.db, ddl);
        }
        let files: Vec<(&str, &str)> = self
            .files
            .iter()
            .map(|(f, t)| (f.as_str(), t.as_str()))
            .collect();
        let rules = rules_dir_with(&files);
        for toml in &self.migrate_rules {
            migrate_apply(&self.db, toml);
        }
        if self.migrate {
            migrate_ok(rules.path(), &self.db, true);
        }
        let mut builder = Proxy::builder().rules_dir(rules.path());
        let mut admin = None;
        if let Some(pw) = &self.admin_password {
            let (b, addr) = builder.listen_arg("--admin");
            builder = b.env("HEATSINK_ADMIN_PASSWORD", pw);
            admin = Some(addr);
        }
        let mut metrics = None;
        if self.metrics {
            let (b, addr) = builder.listen_arg("--metrics");
            builder = b;
            metrics = Some(addr);
        }
        if let Some(var) = &self.log_level_var {
            builder = builder.log_level_from(var);
        }
        for a in &self.args {
            builder = builder.arg(a);
        }
        let proxy = builder.start();
        Env {
            db: self.db,
            proxy,
            rules,
            metrics,
            admin,
        }
    }
}

/// One test's database, rules directory and proxy.
pub struct Env {
    /// The database the test works in.
    pub db: String,
    /// The proxy, in front of [`mariadb()`].
    pub proxy: Proxy,
    /// The proxy's rules directory.
    pub rules: tempfile::TempDir,
    metrics: Option<SocketAddr>,
    admin: Option<SocketAddr>,
}

impl Env {
    /// A builder for database `db` (left as it is unless [`EnvBuilder::schema`] is
    /// given), an empty rules directory, no migrate, no metrics, no admin port.
    pub fn builder(db: impl Into<String>) -> EnvBuilder {
        EnvBuilder {
            db: db.into(),
            schema: None,
            files: Vec::new(),
            migrate: false,
            migrate_rules: Vec::new(),
            metrics: false,
            admin_password: None,
            log_level_var: None,
            args: Vec::new(),
        }
    }

    /// mysql_async URL of the test user through the proxy, in the database.
    pub fn url(&self) -> String {
        self.proxy.url(&self.db)
    }

    /// A connection through the proxy, in the database.
    pub async fn proxied(&self) -> Conn {
        connect(&self.url()).await
    }

    /// A connection straight to MariaDB, in the database.
    pub async fn direct(&self) -> Conn {
        connect(&mariadb().url(&self.db)).await
    }

    /// Rows of a query run as root directly on MariaDB, `{db}` replaced.
    pub fn backend_rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        mariadb().query_strings(&sql.replace("{db}", &self.db))
    }

    /// The first value of [`Env::backend_rows`].
    pub fn backend_scalar(&self, sql: &str) -> Option<String> {
        scalar(&sql.replace("{db}", &self.db))
    }

    /// The `--metrics` address (panics when the proxy has none).
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics.expect("proxy started without --metrics")
    }

    /// The proxy's unlabelled `/metrics` samples.
    pub fn metrics(&self) -> HashMap<String, u64> {
        metrics(self.metrics_addr())
    }

    /// The `--admin` address (panics when the proxy has none).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.expect("proxy started without --admin")
    }

    /// The last 30 lines of the proxy's log.
    pub fn tail(&self) -> String {
        tail(&self.proxy.log_text(), 30)
    }

    /// Panics with `what`, the tail of the proxy's log appended.
    pub fn fail(&self, what: &str) -> ! {
        panic!("{what}\n--- proxy log (tail) ---\n{}", self.tail())
    }

    /// Replaces (or adds) a rule file, writing then renaming as editors and deploy
    /// tools do.
    pub fn write_rule(&self, file: &str, text: &str) {
        let tmp = self.rules.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).expect("write rule file");
        std::fs::rename(&tmp, self.rules.path().join(file)).expect("rename rule file");
    }

    /// Removes a rule file.
    pub fn remove_rule(&self, file: &str) {
        std::fs::remove_file(self.rules.path().join(file)).expect("remove rule file");
    }

    /// The rules directory.
    pub fn rules_path(&self) -> &Path {
        self.rules.path()
    }

    /// Sends SIGHUP to the proxy (by pid).
    pub fn sighup(&self) {
        let pid = self.proxy.pid().expect("proxy running");
        let ok = Command::new("kill")
            .arg("-HUP")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -HUP {pid} failed");
    }
}

/// `YYYY-MM-DD` of a unix time in UTC.
pub fn utc_date(t: i64) -> String {
    let (y, m, d) = heatsink::kinds::calendar::civil(t.div_euclid(86_400));
    format!("{y:04}-{m:02}-{d:02}")
}

/// `YYYY-MM-DD HH:MM:SS` of a unix time in UTC.
pub fn utc_time(t: i64) -> String {
    format!(
        "{} {:02}:{:02}:{:02}",
        utc_date(t),
        t.rem_euclid(86_400) / 3600,
        t.rem_euclid(3600) / 60,
        t.rem_euclid(60)
    )
}
