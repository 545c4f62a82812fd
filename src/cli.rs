//! Command line: `heatsink serve` and friends.
//!
//! Every `serve` flag can also come from a `HEATSINK_<FLAG>` environment variable and
//! from the `--config` TOML file; precedence is flag > env > file > default.

use std::path::PathBuf;

pub use crate::report::OutputFormat;
use clap::{Args, Parser, Subcommand};

use crate::config::{
    BackendPolicy, BackendTlsMode, Config, FileConfig, LogFormat, Overrides, RuntimeMode,
    SchedPolicy, Secret,
};
use crate::error::Error;

/// heatsink: a MySQL wire-protocol proxy that rewrites hot-spot statements.
#[derive(Debug, Parser)]
#[command(name = "heatsink", version = crate::VERSION_LONG, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy.
    Serve(Box<ServeArgs>),
    /// Probe a health endpoint; exit 0 when it answers 200 (for container health checks).
    Health {
        /// Endpoint URL.
        #[arg(long, default_value = "http://127.0.0.1:9633/healthz")]
        url: String,
    },
    /// Create the tables and triggers the rules need (and backfill them).
    ///
    /// Checks every rule against the database (the logical table exists, the columns
    /// the rule names exist with types that fit, the key is the primary key or a
    /// unique key, existing tables and triggers fit) and prints the DDL. Nothing
    /// changes without --apply; with it the statements run, idempotently.
    Migrate(MigrateArgs),
    /// Run the rules' maintenance jobs once (counter: compact; partition: rotate).
    ///
    /// Every job of every rule, or only --job / --rule. Without --apply this is a dry
    /// run: each job prints the statements it would run and what they would do, and
    /// nothing changes. With --apply each run holds a named lock on the database, so
    /// the same job started from several places runs once at a time; schedule it
    /// (cron, a sidecar loop) next to every proxy.
    Maintain(MaintainArgs),
    /// Fold counter slot deltas back into the base values, online
    /// (`maintain --job compact --apply`: it executes at once).
    ///
    /// One short transaction per key: lock its slot rows, add their sums to the logical
    /// row (creating it if missing), delete them. Reads through the proxy stay exact
    /// while it runs; deadlocks are retried. `heatsink maintain --job compact` without
    /// --apply shows what it would do.
    Compact(CompactArgs),
    /// Validate rule files before deploying them, then run their [[test]] cases.
    ///
    /// Checks TOML syntax, unknown keys, impossible values, duplicate rule names and
    /// rules sharing a table; with --backend-url also the live schema (the checks of
    /// `migrate`: tables exist, keys and column types fit, the trigger is in place).
    /// One line per problem (`file:line: rule 'name': reason`); exit 1 on any problem
    /// or failing test case.
    Check(CheckArgs),
    /// Show what the proxy would do with statements: the rule that acts, the
    /// rewritten statements, what the client sees, or why a statement is refused.
    ///
    /// Statements come from the arguments or from stdin, one per line.
    Explain(ExplainArgs),
    /// Find the hot spots of a workload and propose the rules that answer them.
    ///
    /// Reads the statements from a proxy's admin port (`SHOW DIGESTS`), a JSON dump
    /// of it, or the server's performance_schema (before heatsink is deployed); with
    /// --backend-url also the tables they use and the server's evidence (deadlocks,
    /// row lock waits). Each proposal is a rule validated as `check` validates it,
    /// with the statements it answers, their share of the load, the evidence, the
    /// expected effect (the project's own measurements) and what `migrate` will
    /// create, best first. `--format toml` prints a rule file `check` accepts.
    Advise(AdviseArgs),
}

/// `heatsink advise` flags.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("workload").required(true).args(["admin", "digests", "from_performance_schema"])))]
pub struct AdviseArgs {
    /// A running proxy's admin port, mysql://admin:PW@HOST:PORT: read SHOW DIGESTS.
    #[arg(long)]
    pub admin: Option<String>,
    /// A JSON dump of SHOW DIGESTS (an array of objects with its columns).
    #[arg(long)]
    pub digests: Option<PathBuf>,
    /// Read the statements from the --backend-url server's performance_schema
    /// (events_statements_summary_by_digest; literal samples from
    /// events_statements_history_long when that consumer is on).
    #[arg(long)]
    pub from_performance_schema: bool,
    /// mysql://user:password@host:port/db: read the tables and the server's evidence,
    /// and check every proposal against them.
    #[arg(long)]
    pub backend_url: Option<String>,
    /// Database of statements that ran without one [default: the URL's].
    #[arg(long)]
    pub db: Option<String>,
    /// A table of at least this many rows is large (rollup, partition, timeline).
    #[arg(long, default_value_t = 1_000_000)]
    pub large_rows: u64,
    /// A key is hot when its most frequent value carries at least this share of its
    /// statement's executions (counter).
    #[arg(long, default_value_t = 0.05)]
    pub hot_share: f64,
    /// A proposal must answer at least this share of the executions or of the time.
    #[arg(long, default_value_t = 0.01)]
    pub min_share: f64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = crate::advise::AdviseFormat::Text)]
    pub format: crate::advise::AdviseFormat,
}

/// `heatsink check` flags.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Rule file or directory of *.toml rule files.
    #[arg(long, env = "HEATSINK_RULES")]
    pub rules: PathBuf,
    /// mysql://user:password@host:port/db: also check the rules against this database.
    #[arg(long)]
    pub backend_url: Option<String>,
    /// Default database for tables and test cases that name none [default: the URL's].
    #[arg(long)]
    pub db: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub format: OutputFormat,
}

/// `heatsink explain` flags.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Rule file or directory of *.toml rule files.
    #[arg(long, env = "HEATSINK_RULES")]
    pub rules: PathBuf,
    /// mysql://user:password@host:port/db: read the tables' columns from this database
    /// (without it, rules plan with an assumed column list).
    #[arg(long)]
    pub backend_url: Option<String>,
    /// The connection's default database [default: the URL's].
    #[arg(long)]
    pub db: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub format: OutputFormat,
    /// Statements to explain; without any, one statement per line from stdin.
    pub sql: Vec<String>,
}

/// `heatsink migrate` flags.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Rule file or directory of *.toml rule files.
    #[arg(long, env = "HEATSINK_RULES")]
    pub rules: PathBuf,
    /// mysql://user:password@host:port/db; tables without a `db.` prefix live in db.
    #[arg(long, env = "HEATSINK_BACKEND_URL")]
    pub backend_url: String,
    /// Execute the statements instead of only printing them.
    #[arg(long)]
    pub apply: bool,
    /// Only the rule with this name.
    #[arg(long)]
    pub rule: Option<String>,
    /// Print the GRANTs users need on the rules' tables instead of running them, also
    /// with --apply (for DBAs who apply grants by hand).
    #[arg(long)]
    pub print_grants: bool,
    /// Take this rule back out of the database instead: counter slot rows are folded
    /// into the logical table, a ring is copied back into its log, then the rule's
    /// side tables and triggers are dropped. The rule must first leave every proxy
    /// (removed from --rules and reloaded); its definition is read from the
    /// heatsink_rules table migrate --apply writes. A dry run without --apply.
    #[arg(long, value_name = "RULE", conflicts_with_all = ["rule", "print_grants"])]
    pub revert: Option<String>,
    /// With --revert: seconds to watch a side table only proxies running the rule
    /// write (a counter's slot table) before touching it; a change refuses the
    /// revert. 0 skips the watch.
    #[arg(long, default_value_t = 2.0, requires = "revert")]
    pub observe: f64,
    /// With --revert: keys per chunk (a counter's fold: a transaction each; a ring's
    /// copy back: chunks of its one transaction); --chunk overrides it.
    #[arg(long, default_value_t = 1000, requires = "revert")]
    pub batch: usize,
    /// Leave the long jobs that can wait (a push timeline's mailbox fill) to
    /// `heatsink maintain --apply` (or serve --maintain-url).
    #[arg(long)]
    pub defer_jobs: bool,
    #[command(flatten)]
    pub jobs: JobArgs,
}

/// Flags of the long jobs `migrate` and `maintain` run (backfills, fills).
#[derive(Debug, Args, Clone)]
pub struct JobArgs {
    /// At most this many rows a second (log rows of a backfill, readers of a
    /// mailbox fill) in long jobs [default: no limit].
    #[arg(long, value_name = "N")]
    pub max_rows_per_second: Option<f64>,
    /// Rows per chunk of a long job, each chunk one transaction with its progress
    /// [default: 10000 log rows for a rollup backfill, 100 readers for a mailbox fill,
    /// 1000 keys for a ring backfill (chunks of its one transaction)].
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub chunk: Option<usize>,
    /// Seconds between the progress lines of a long job when stderr is not a
    /// terminal (on a terminal: a progress bar).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::jobs::DEFAULT_REPORT_SECONDS)]
    pub progress_every: f64,
    /// mysql://user:password@host:port of a replica: long jobs wait while its
    /// Seconds_Behind_Master exceeds 10 (Galera lag is read on the backend itself).
    #[arg(long, value_name = "URL", hide_env_values = true)]
    pub replica_url: Option<String>,
    /// Seconds a chunk of a long job waits for a row lock the application holds
    /// before it gives way: rolled back and retried after a pause (up to 10 times)
    /// [default: the server's innodb_lock_wait_timeout].
    #[arg(long, value_name = "SECONDS", value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=86400))]
    pub lock_wait_timeout: Option<u64>,
}

impl JobArgs {
    /// The runner's settings.
    pub fn settings(&self) -> Result<crate::jobs::Settings, crate::error::Error> {
        let bad = |m: String| crate::error::Error::new(crate::error::Source::Rules, m);
        if let Some(r) = self.max_rows_per_second {
            if !(r.is_finite() && r > 0.0) {
                return Err(bad(format!(
                    "--max-rows-per-second must be a positive number, not {r}"
                )));
            }
        }
        if !(self.progress_every.is_finite() && self.progress_every > 0.0) {
            return Err(bad(format!(
                "--progress-every must be a positive number of seconds, not {}",
                self.progress_every
            )));
        }
        Ok(crate::jobs::Settings {
            chunk: self.chunk,
            max_rows_per_second: self.max_rows_per_second,
            report_every: std::time::Duration::from_secs_f64(self.progress_every),
            replica_url: self.replica_url.clone(),
            progress: true,
            lock_wait_timeout: self.lock_wait_timeout,
        })
    }
}

/// `heatsink maintain` flags.
#[derive(Debug, Args)]
pub struct MaintainArgs {
    /// Rule file or directory of *.toml rule files.
    #[arg(long, env = "HEATSINK_RULES")]
    pub rules: PathBuf,
    /// mysql://user:password@host:port/db; tables without a `db.` prefix live in db.
    #[arg(long, env = "HEATSINK_BACKEND_URL")]
    pub backend_url: String,
    /// Only the rule with this name.
    #[arg(long)]
    pub rule: Option<String>,
    /// Only this job (e.g. compact, rotate).
    #[arg(long)]
    pub job: Option<String>,
    /// Execute the jobs instead of only printing what they would do.
    #[arg(long)]
    pub apply: bool,
    /// Keys or rows per batch, for jobs that work in batches.
    #[arg(long, default_value_t = crate::maintain::DEFAULT_BATCH, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub batch: usize,
    #[command(flatten)]
    pub jobs: JobArgs,
}

/// `heatsink compact` flags.
#[derive(Debug, Args)]
pub struct CompactArgs {
    /// Rule file or directory of *.toml rule files.
    #[arg(long, env = "HEATSINK_RULES")]
    pub rules: PathBuf,
    /// mysql://user:password@host:port/db; tables without a `db.` prefix live in db.
    #[arg(long, env = "HEATSINK_BACKEND_URL")]
    pub backend_url: String,
    /// Only the counter rule with this name.
    #[arg(long)]
    pub rule: Option<String>,
    /// Keys read per scan of the slot table (each key is still its own transaction).
    #[arg(long, default_value_t = crate::maintain::DEFAULT_BATCH, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub batch: usize,
}

/// `heatsink serve` flags. All optional here: defaults are applied after merging the
/// config file, so that a file value is not shadowed by a flag default.
#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    /// Address to accept client connections on [default: 127.0.0.1:6033].
    #[arg(long, env = "HEATSINK_LISTEN")]
    pub listen: Option<String>,
    /// Also accept clients on this Unix socket (applications on the same host, e.g.
    /// a sidecar's; the file is created, and removed at shutdown) [default: none].
    #[arg(long, env = "HEATSINK_LISTEN_UNIX")]
    pub listen_unix: Option<PathBuf>,
    /// MySQL/MariaDB server address [default: 127.0.0.1:3306].
    #[arg(long, env = "HEATSINK_BACKEND")]
    pub backend: Option<String>,
    /// Rule file or directory of *.toml rule files [default: none: no rules, every
    /// statement passes through unchanged].
    #[arg(long, env = "HEATSINK_RULES")]
    pub rules: Option<PathBuf>,
    /// How a client connection's node is chosen among several backends
    /// [default: least-connections].
    #[arg(long, env = "HEATSINK_BACKEND_POLICY", value_enum)]
    pub backend_policy: Option<BackendPolicy>,
    /// Milliseconds between health checks of each backend [default: 1000].
    #[arg(long, env = "HEATSINK_HEALTH_INTERVAL_MS")]
    pub health_interval_ms: Option<u64>,
    /// Milliseconds one health check may take [default: 1000].
    #[arg(long, env = "HEATSINK_HEALTH_TIMEOUT_MS")]
    pub health_timeout_ms: Option<u64>,
    /// User the health checker logs in as to read a Galera node's state; without
    /// it a backend that answers counts as up.
    #[arg(long, env = "HEATSINK_HEALTH_USER")]
    pub health_user: Option<String>,
    /// Password of --health-user (prefer the environment variable or the config file).
    #[arg(long, env = "HEATSINK_HEALTH_PASSWORD", hide_env_values = true)]
    pub health_password: Option<Secret>,
    /// Admin port address (MySQL protocol), e.g. 127.0.0.1:6032.
    #[arg(long, env = "HEATSINK_ADMIN")]
    pub admin: Option<String>,
    /// User name for the admin port [default: admin].
    #[arg(long, env = "HEATSINK_ADMIN_USER")]
    pub admin_user: Option<String>,
    /// Password for the admin port; prefer the environment variable or the config
    /// file, command lines are visible to other local users. Required unless the admin
    /// port listens on loopback.
    #[arg(long, env = "HEATSINK_ADMIN_PASSWORD", hide_env_values = true)]
    pub admin_password: Option<Secret>,
    /// Prometheus metrics address.
    #[arg(long, env = "HEATSINK_METRICS")]
    pub metrics: Option<String>,
    /// TOML config file.
    #[arg(long, env = "HEATSINK_CONFIG")]
    pub config: Option<PathBuf>,
    /// Maximum concurrent client connections [default: 1000].
    #[arg(long, env = "HEATSINK_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Seconds a client may stay idle between commands; 0 = forever [default: 28800].
    #[arg(long, env = "HEATSINK_IDLE_TIMEOUT")]
    pub idle_timeout: Option<u64>,
    /// Seconds allowed for the connection phase [default: 10].
    #[arg(long, env = "HEATSINK_HANDSHAKE_TIMEOUT")]
    pub handshake_timeout: Option<u64>,
    /// Seconds allowed to connect to the backend [default: 5].
    #[arg(long, env = "HEATSINK_CONNECT_TIMEOUT")]
    pub connect_timeout: Option<u64>,
    /// Seconds in-flight statements get to finish on shutdown [default: 30].
    #[arg(long, env = "HEATSINK_DRAIN_TIMEOUT")]
    pub drain_timeout: Option<u64>,
    /// Log format [default: human].
    #[arg(long, env = "HEATSINK_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter, e.g. info, debug, heatsink=debug [default: info].
    #[arg(long, env = "HEATSINK_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Show literal values in debug logs of rewrites (off: literals appear as `?`).
    #[arg(long, env = "HEATSINK_LOG_LITERALS", num_args = 0..=1, default_missing_value = "true")]
    pub log_literals: Option<bool>,
    /// Statement plans cached per rule set [default: 10000].
    #[arg(long, env = "HEATSINK_PLAN_CACHE_SIZE")]
    pub plan_cache_size: Option<u64>,
    /// Statement shapes kept by each of SHOW REFUSALS and SHOW FALLBACKS on the admin
    /// port (the least recently seen is evicted; 0: none kept, none logged)
    /// [default: 1000].
    #[arg(long, env = "HEATSINK_SHAPE_TABLE_SIZE")]
    pub shape_table_size: Option<usize>,
    /// Rows of SHOW DIGESTS on the admin port: query digests of all traffic per
    /// digest, default database and user (the least recently seen is evicted; 0:
    /// digests off) [default: 2000].
    #[arg(long, env = "HEATSINK_DIGEST_TABLE_SIZE")]
    pub digest_table_size: Option<usize>,
    /// Client commands of this many bytes or more are refused with ERR 1153 and the
    /// connection is closed, as the server does [default: each session's backend
    /// max_allowed_packet, learned when a command first reaches 1 MiB].
    #[arg(long, env = "HEATSINK_MAX_CLIENT_PACKET")]
    pub max_client_packet: Option<u64>,
    /// PEM certificate chain for client TLS; with --tls-key the proxy offers TLS to
    /// clients and terminates it.
    #[arg(long, env = "HEATSINK_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "HEATSINK_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Refuse clients that do not upgrade to TLS (ERR 3159).
    #[arg(long, env = "HEATSINK_TLS_REQUIRED", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
    pub tls_required: bool,
    /// TLS towards the backend: off, preferred (when offered) or required [default: off].
    #[arg(long, env = "HEATSINK_BACKEND_TLS", value_enum)]
    pub backend_tls: Option<BackendTlsMode>,
    /// PEM CA certificate(s) the backend's certificate is verified against.
    #[arg(long, env = "HEATSINK_BACKEND_TLS_CA")]
    pub backend_tls_ca: Option<PathBuf>,
    /// Do not verify the backend's certificate (encrypted but open to interception).
    #[arg(long, env = "HEATSINK_BACKEND_TLS_INSECURE", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
    pub backend_tls_insecure: bool,
    /// Name expected in the backend's certificate [default: the host of --backend].
    #[arg(long, env = "HEATSINK_BACKEND_TLS_SERVER_NAME")]
    pub backend_tls_server_name: Option<String>,
    /// mysql://user:pw@host:port/db to run the rules' maintenance jobs with
    /// (`heatsink maintain --apply`: partition rotation, counter compaction) every
    /// --maintain-interval; a named lock in the database lets one proxy of many
    /// do each run [default: off].
    #[arg(long, env = "HEATSINK_MAINTAIN_URL", hide_env_values = true)]
    pub maintain_url: Option<Secret>,
    /// Seconds between maintenance runs [default: 3600].
    #[arg(long, env = "HEATSINK_MAINTAIN_INTERVAL")]
    pub maintain_interval: Option<u64>,
    /// At most this many rows (log rows, readers) a second in the long jobs the
    /// maintenance runs do (a mailbox fill) [default: no limit].
    #[arg(long, env = "HEATSINK_MAX_ROWS_PER_SECOND", value_name = "N")]
    pub max_rows_per_second: Option<f64>,
    /// How sessions run on threads: shared (one multi-threaded runtime, work
    /// stealing) or per-core (a single-threaded runtime and a listener per thread;
    /// a session stays on the thread that accepted it) [default: shared].
    #[arg(long, env = "HEATSINK_RUNTIME", value_enum)]
    pub runtime: Option<RuntimeMode>,
    /// Threads that run sessions [default: one per available core].
    #[arg(long, env = "HEATSINK_RUNTIME_THREADS", value_name = "N")]
    pub runtime_threads: Option<usize>,
    /// The scheduling policy of the proxy's threads: inherit (keep the policy heatsink
    /// was started with) or batch (SCHED_BATCH: woken by a client's or the server's
    /// bytes, a proxy thread lets the sender go on until it waits instead of
    /// preempting it; less CPU per statement on a host whose cores only the clients
    /// and the server share, slower answers next to CPU-bound work) [default: inherit].
    #[arg(long, env = "HEATSINK_SCHED_POLICY", value_enum)]
    pub sched_policy: Option<SchedPolicy>,
}

impl ServeArgs {
    /// The effective configuration: flags/env over the config file over defaults.
    pub fn resolve(self) -> Result<Config, Error> {
        let file = match &self.config {
            Some(p) => FileConfig::load(p)?,
            None => FileConfig::default(),
        };
        let o = Overrides {
            listen: self.listen,
            listen_unix: self.listen_unix,
            backend: self.backend,
            backend_policy: self.backend_policy,
            health_interval_ms: self.health_interval_ms,
            health_timeout_ms: self.health_timeout_ms,
            health_user: self.health_user,
            health_password: self.health_password,
            rules: self.rules,
            admin: self.admin,
            admin_user: self.admin_user,
            admin_password: self.admin_password,
            metrics: self.metrics,
            max_connections: self.max_connections,
            idle_timeout: self.idle_timeout,
            handshake_timeout: self.handshake_timeout,
            connect_timeout: self.connect_timeout,
            drain_timeout: self.drain_timeout,
            log_format: self.log_format,
            log_level: self.log_level,
            log_literals: self.log_literals,
            plan_cache_size: self.plan_cache_size,
            shape_table_size: self.shape_table_size,
            digest_table_size: self.digest_table_size,
            max_client_packet: self.max_client_packet,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
            // A flag that is absent leaves the config file's value in force.
            tls_required: self.tls_required.then_some(true),
            backend_tls: self.backend_tls,
            backend_tls_ca: self.backend_tls_ca,
            backend_tls_insecure: self.backend_tls_insecure.then_some(true),
            backend_tls_server_name: self.backend_tls_server_name,
            maintain_url: self.maintain_url,
            maintain_interval: self.maintain_interval,
            max_rows_per_second: self.max_rows_per_second,
            runtime: self.runtime,
            runtime_threads: self.runtime_threads,
            sched_policy: self.sched_policy,
        };
        Config::resolve(o, file)
    }
}
