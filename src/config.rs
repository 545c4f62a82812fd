//! Runtime configuration: one struct, filled from flags, `HEATSINK_*` environment
//! variables, a TOML file and defaults, in that order of precedence.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Source};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (default).
    #[default]
    Human,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Whether the proxy speaks TLS to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendTlsMode {
    /// Plain TCP to the backend (default).
    #[default]
    Off,
    /// TLS when the backend's greeting offers it, plain otherwise.
    Preferred,
    /// TLS always; a backend that does not offer it is an error for every client.
    Required,
}

/// A password: kept out of `Debug` output and logs.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_string()))
    }
}

/// Seconds between maintenance runs of `serve` by default (with `maintain_url`).
pub const DEFAULT_MAINTAIN_INTERVAL: u64 = 3600;

/// Smallest `max_client_packet` (the server's minimum `max_allowed_packet`).
pub const MIN_CLIENT_PACKET: u64 = 1024;
/// Largest `max_client_packet` (the server's maximum `max_allowed_packet`, 1 GiB).
pub const MAX_CLIENT_PACKET: u64 = 1 << 30;

/// How a client connection's backend node is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BackendPolicy {
    /// The healthy node with the fewest client connections (multi-primary clusters).
    LeastConnections,
    /// The first healthy node in the list (single-primary use with failover).
    First,
}

/// How `serve` runs its sessions on threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeMode {
    /// One multi-threaded runtime: sessions move between its worker threads (work
    /// stealing); one accept loop (default).
    #[default]
    Shared,
    /// One single-threaded runtime per thread, each with its own TCP listener on the
    /// same address (`SO_REUSEPORT`, the kernel spreads connections): a session, its
    /// backend connection and its replies stay on the thread that accepted it.
    PerCore,
}

/// The Linux scheduling policy of `serve`'s threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SchedPolicy {
    /// Keep the policy the process was started with (`SCHED_OTHER`, or whatever `chrt`
    /// set). (default)
    #[default]
    Inherit,
    /// `SCHED_BATCH`: a proxy thread woken by a peer's bytes does not preempt the peer,
    /// which is about to wait for the answer anyway; the proxy runs once it does (one
    /// context switch per hop instead of two). Less CPU per statement where heatsink
    /// shares the cores only with its clients and the server; slower answers next to
    /// CPU-bound work, which a woken batch thread waits behind.
    Batch,
}

/// Most threads `runtime_threads` may ask for.
pub const MAX_RUNTIME_THREADS: usize = 1024;

/// Default admin port user.
pub const DEFAULT_ADMIN_USER: &str = "admin";

/// Everything `heatsink serve` needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address clients connect to.
    pub listen: String,
    /// A Unix socket clients on this host may connect to as well (a sidecar's
    /// application skips the TCP stack); off when `None`.
    pub listen_unix: Option<PathBuf>,
    /// The MySQL/MariaDB server(s) client connections are relayed to: one address, or
    /// a comma-separated list (the nodes of a cluster); each client connection gets
    /// one healthy node (see [`crate::backends`]).
    pub backend: String,
    /// How a client connection's node is chosen among several backends.
    pub backend_policy: BackendPolicy,
    /// The health checker looks at every backend this often.
    pub health_interval: Duration,
    /// One health check (connect, greeting, status query) must finish within this.
    pub health_timeout: Duration,
    /// User the health checker logs in as to read a Galera node's state
    /// (`wsrep_ready`, `wsrep_local_state_comment`); without one, a backend that
    /// answers with a greeting counts as up.
    pub health_user: Option<String>,
    /// Password of `health_user`.
    pub health_password: Secret,
    /// Rule file, or directory of `*.toml` rule files; `None` (the default): no rules,
    /// a pure passthrough proxy.
    pub rules: Option<PathBuf>,
    /// Admin port (MySQL protocol), off when `None`.
    pub admin: Option<String>,
    /// User name the admin port accepts.
    pub admin_user: String,
    /// Password the admin port requires (mysql_native_password). Empty is allowed
    /// only when the admin port listens on a loopback address.
    pub admin_password: Secret,
    /// Prometheus metrics / health endpoint, off when `None`.
    pub metrics: Option<String>,
    /// Client connections served at once; more get "Too many connections".
    pub max_connections: usize,
    /// A client idle this long between commands is disconnected (zero: never).
    pub idle_timeout: Duration,
    /// The whole connection phase (greeting to auth OK) must finish within this.
    pub handshake_timeout: Duration,
    /// Connecting to the backend must succeed within this.
    pub connect_timeout: Duration,
    /// On shutdown, in-flight statements get this long to finish.
    pub drain_timeout: Duration,
    /// Log format on stderr.
    pub log_format: LogFormat,
    /// Log filter (`info`, `debug`, `heatsink=debug,warn`, …).
    pub log_level: String,
    /// Debug logs of rewrites show the rewritten SQL with its literal values; off,
    /// literals appear as `?` (no log line ever shows a literal at info level).
    pub log_literals: bool,
    /// Number of statement plans cached per rule set.
    pub plan_cache_size: u64,
    /// Statement shapes kept by each of `SHOW REFUSALS` and `SHOW FALLBACKS` (the
    /// least recently seen is evicted); zero keeps none and logs none.
    pub shape_table_size: usize,
    /// Rows of `SHOW DIGESTS` (query digests of all traffic, per digest, default
    /// database and user; the least recently seen is evicted); zero turns digests off.
    pub digest_table_size: usize,
    /// A client command whose payload is this many bytes or more is refused the way
    /// the server refuses it (ERR 1153, then the connection closes), without the proxy
    /// buffering the rest. Same meaning as the server's `max_allowed_packet`. `None`:
    /// each session learns its backend session's `max_allowed_packet` the first time
    /// a command reaches [`crate::relay::LEARN_PACKET_LIMIT_AT`] bytes.
    pub max_client_packet: Option<u64>,
    /// PEM certificate chain presented to clients; with `tls_key`, the greeting offers
    /// TLS and the proxy terminates it.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// Clients that do not upgrade to TLS are refused (ERR 3159).
    pub tls_required: bool,
    /// TLS towards the backend.
    pub backend_tls: BackendTlsMode,
    /// PEM CA certificate(s) the backend's certificate must chain to.
    pub backend_tls_ca: Option<PathBuf>,
    /// Skip verification of the backend's certificate (encrypted, not authenticated).
    pub backend_tls_insecure: bool,
    /// Name the backend's certificate must carry; default: the host of `backend`.
    pub backend_tls_server_name: Option<String>,
    /// `mysql://user:pw@host:port/db` the proxy runs the rules' maintenance jobs
    /// with (`heatsink maintain`: partition rotation, counter compaction) every
    /// `maintain_interval`; off when `None`. Each run holds the job's named lock in
    /// the database, so of many proxies one does the work.
    pub maintain_url: Option<Secret>,
    /// Time between maintenance runs.
    pub maintain_interval: Duration,
    /// At most this many rows (log rows, readers) a second in the long jobs
    /// maintenance runs (a mailbox fill); `None`: no limit.
    pub max_rows_per_second: Option<f64>,
    /// How sessions run on threads (see [`crate::server`]).
    pub runtime: RuntimeMode,
    /// Threads that run sessions; `None`: one per available core.
    pub runtime_threads: Option<usize>,
    /// The scheduling policy of every thread (see [`crate::server::runtime`]).
    pub sched_policy: SchedPolicy,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:6033".into(),
            listen_unix: None,
            backend: "127.0.0.1:3306".into(),
            backend_policy: BackendPolicy::LeastConnections,
            health_interval: Duration::from_millis(1000),
            health_timeout: Duration::from_millis(1000),
            health_user: None,
            health_password: Secret::default(),
            rules: None,
            admin: None,
            admin_user: DEFAULT_ADMIN_USER.into(),
            admin_password: Secret::default(),
            metrics: None,
            max_connections: 1000,
            idle_timeout: Duration::from_secs(28_800),
            handshake_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(30),
            log_format: LogFormat::Human,
            log_level: "info".into(),
            log_literals: false,
            plan_cache_size: 10_000,
            shape_table_size: crate::refusals::DEFAULT_SHAPES,
            digest_table_size: crate::digest::DEFAULT_DIGESTS,
            max_client_packet: None,
            maintain_url: None,
            maintain_interval: Duration::from_secs(DEFAULT_MAINTAIN_INTERVAL),
            max_rows_per_second: None,
            runtime: RuntimeMode::Shared,
            runtime_threads: None,
            sched_policy: SchedPolicy::Inherit,
            tls_cert: None,
            tls_key: None,
            tls_required: false,
            backend_tls: BackendTlsMode::Off,
            backend_tls_ca: None,
            backend_tls_insecure: false,
            backend_tls_server_name: None,
        }
    }
}

/// The TOML file's shape: every key optional, unknown keys rejected.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub listen_unix: Option<PathBuf>,
    pub backend: Option<String>,
    pub backend_policy: Option<BackendPolicy>,
    pub health_interval_ms: Option<u64>,
    pub health_timeout_ms: Option<u64>,
    pub health_user: Option<String>,
    pub health_password: Option<Secret>,
    pub rules: Option<PathBuf>,
    pub admin: Option<String>,
    pub admin_user: Option<String>,
    pub admin_password: Option<Secret>,
    pub metrics: Option<String>,
    pub max_connections: Option<usize>,
    pub idle_timeout: Option<u64>,
    pub handshake_timeout: Option<u64>,
    pub connect_timeout: Option<u64>,
    pub drain_timeout: Option<u64>,
    pub log_format: Option<LogFormat>,
    pub log_level: Option<String>,
    pub log_literals: Option<bool>,
    pub plan_cache_size: Option<u64>,
    pub shape_table_size: Option<usize>,
    pub digest_table_size: Option<usize>,
    pub max_client_packet: Option<u64>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_required: Option<bool>,
    pub backend_tls: Option<BackendTlsMode>,
    pub backend_tls_ca: Option<PathBuf>,
    pub backend_tls_insecure: Option<bool>,
    pub backend_tls_server_name: Option<String>,
    pub maintain_url: Option<Secret>,
    pub maintain_interval: Option<u64>,
    pub max_rows_per_second: Option<f64>,
    pub runtime: Option<RuntimeMode>,
    pub runtime_threads: Option<usize>,
    pub sched_policy: Option<SchedPolicy>,
}

impl FileConfig {
    /// Parses a config file's text; `origin` names it in errors.
    pub fn from_str(text: &str, origin: &str) -> Result<Self, Error> {
        toml::from_str(text).map_err(|e| {
            Error::new(
                Source::Internal,
                format!("config file {origin}: {}", e.to_string().trim()),
            )
        })
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::with_cause(
                Source::Internal,
                format!("reading config file {}", path.display()),
                e,
            )
        })?;
        Self::from_str(&text, &path.display().to_string())
    }
}

/// Values given on the command line or in the environment (clap already applied
/// flag-over-env); `None` means "not given".
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub listen_unix: Option<PathBuf>,
    pub backend: Option<String>,
    pub backend_policy: Option<BackendPolicy>,
    pub health_interval_ms: Option<u64>,
    pub health_timeout_ms: Option<u64>,
    pub health_user: Option<String>,
    pub health_password: Option<Secret>,
    pub rules: Option<PathBuf>,
    pub admin: Option<String>,
    pub admin_user: Option<String>,
    pub admin_password: Option<Secret>,
    pub metrics: Option<String>,
    pub max_connections: Option<usize>,
    pub idle_timeout: Option<u64>,
    pub handshake_timeout: Option<u64>,
    pub connect_timeout: Option<u64>,
    pub drain_timeout: Option<u64>,
    pub log_format: Option<LogFormat>,
    pub log_level: Option<String>,
    pub log_literals: Option<bool>,
    pub plan_cache_size: Option<u64>,
    pub shape_table_size: Option<usize>,
    pub digest_table_size: Option<usize>,
    pub max_client_packet: Option<u64>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_required: Option<bool>,
    pub backend_tls: Option<BackendTlsMode>,
    pub backend_tls_ca: Option<PathBuf>,
    pub backend_tls_insecure: Option<bool>,
    pub backend_tls_server_name: Option<String>,
    pub maintain_url: Option<Secret>,
    pub maintain_interval: Option<u64>,
    pub max_rows_per_second: Option<f64>,
    pub runtime: Option<RuntimeMode>,
    pub runtime_threads: Option<usize>,
    pub sched_policy: Option<SchedPolicy>,
}

impl Config {
    /// Merges command line/environment over file over defaults.
    pub fn resolve(cli: Overrides, file: FileConfig) -> Result<Config, Error> {
        let d = Config::default();
        let secs = Duration::from_secs;
        let c = Config {
            listen: cli.listen.or(file.listen).unwrap_or(d.listen),
            listen_unix: cli.listen_unix.or(file.listen_unix),
            backend: cli.backend.or(file.backend).unwrap_or(d.backend),
            backend_policy: cli
                .backend_policy
                .or(file.backend_policy)
                .unwrap_or(d.backend_policy),
            health_interval: cli
                .health_interval_ms
                .or(file.health_interval_ms)
                .map(Duration::from_millis)
                .unwrap_or(d.health_interval),
            health_timeout: cli
                .health_timeout_ms
                .or(file.health_timeout_ms)
                .map(Duration::from_millis)
                .unwrap_or(d.health_timeout),
            health_user: cli.health_user.or(file.health_user),
            health_password: cli
                .health_password
                .or(file.health_password)
                .unwrap_or(d.health_password),
            rules: cli.rules.or(file.rules).or(d.rules),
            admin: cli.admin.or(file.admin),
            admin_user: cli.admin_user.or(file.admin_user).unwrap_or(d.admin_user),
            admin_password: cli
                .admin_password
                .or(file.admin_password)
                .unwrap_or(d.admin_password),
            metrics: cli.metrics.or(file.metrics),
            max_connections: cli
                .max_connections
                .or(file.max_connections)
                .unwrap_or(d.max_connections),
            idle_timeout: cli
                .idle_timeout
                .or(file.idle_timeout)
                .map(secs)
                .unwrap_or(d.idle_timeout),
            handshake_timeout: cli
                .handshake_timeout
                .or(file.handshake_timeout)
                .map(secs)
                .unwrap_or(d.handshake_timeout),
            connect_timeout: cli
                .connect_timeout
                .or(file.connect_timeout)
                .map(secs)
                .unwrap_or(d.connect_timeout),
            drain_timeout: cli
                .drain_timeout
                .or(file.drain_timeout)
                .map(secs)
                .unwrap_or(d.drain_timeout),
            log_format: cli.log_format.or(file.log_format).unwrap_or(d.log_format),
            log_level: cli.log_level.or(file.log_level).unwrap_or(d.log_level),
            log_literals: cli
                .log_literals
                .or(file.log_literals)
                .unwrap_or(d.log_literals),
            plan_cache_size: cli
                .plan_cache_size
                .or(file.plan_cache_size)
                .unwrap_or(d.plan_cache_size),
            shape_table_size: cli
                .shape_table_size
                .or(file.shape_table_size)
                .unwrap_or(d.shape_table_size),
            digest_table_size: cli
                .digest_table_size
                .or(file.digest_table_size)
                .unwrap_or(d.digest_table_size),
            max_client_packet: cli.max_client_packet.or(file.max_client_packet),
            tls_cert: cli.tls_cert.or(file.tls_cert),
            tls_key: cli.tls_key.or(file.tls_key),
            tls_required: cli
                .tls_required
                .or(file.tls_required)
                .unwrap_or(d.tls_required),
            backend_tls: cli
                .backend_tls
                .or(file.backend_tls)
                .unwrap_or(d.backend_tls),
            backend_tls_ca: cli.backend_tls_ca.or(file.backend_tls_ca),
            backend_tls_insecure: cli
                .backend_tls_insecure
                .or(file.backend_tls_insecure)
                .unwrap_or(d.backend_tls_insecure),
            backend_tls_server_name: cli.backend_tls_server_name.or(file.backend_tls_server_name),
            maintain_url: cli.maintain_url.or(file.maintain_url),
            maintain_interval: cli
                .maintain_interval
                .or(file.maintain_interval)
                .map(secs)
                .unwrap_or(d.maintain_interval),
            max_rows_per_second: cli.max_rows_per_second.or(file.max_rows_per_second),
            runtime: cli.runtime.or(file.runtime).unwrap_or(d.runtime),
            runtime_threads: cli.runtime_threads.or(file.runtime_threads),
            sched_policy: cli
                .sched_policy
                .or(file.sched_policy)
                .unwrap_or(d.sched_policy),
        };
        c.validate()
    }

    /// Rejects impossible values.
    pub fn validate(self) -> Result<Config, Error> {
        let bad = |m: &str| {
            Err(Error::new(
                Source::Internal,
                format!("invalid configuration: {m}"),
            ))
        };
        if self.max_connections == 0 {
            return bad("max_connections must be at least 1");
        }
        if self
            .runtime_threads
            .is_some_and(|n| !(1..=MAX_RUNTIME_THREADS).contains(&n))
        {
            return bad(&format!(
                "runtime_threads must be between 1 and {MAX_RUNTIME_THREADS}"
            ));
        }
        if self.maintain_url.is_some() && self.rules.is_none() {
            return bad("maintain_url runs the rules' maintenance jobs: it needs rules (--rules)");
        }
        if self
            .max_rows_per_second
            .is_some_and(|r| !(r.is_finite() && r > 0.0))
        {
            return bad("max_rows_per_second must be a positive number");
        }
        if self.maintain_url.is_some() && self.maintain_interval.is_zero() {
            return bad("maintain_interval must be at least 1 second");
        }
        if let Some(n) = self.max_client_packet {
            if !(MIN_CLIENT_PACKET..=MAX_CLIENT_PACKET).contains(&n) {
                return bad(&format!(
                    "max_client_packet must be between {MIN_CLIENT_PACKET} and {MAX_CLIENT_PACKET} bytes (the range of max_allowed_packet)"
                ));
            }
        }
        if self.handshake_timeout.is_zero() || self.connect_timeout.is_zero() {
            return bad("handshake_timeout and connect_timeout must be at least 1 second");
        }
        if parse_list(&self.backend).is_empty() {
            return bad("backend must name at least one address");
        }
        if self.health_interval.is_zero() || self.health_timeout.is_zero() {
            return bad("health_interval_ms and health_timeout_ms must be at least 1");
        }
        if self.shape_table_size > crate::refusals::MAX_SHAPES {
            return bad(&format!(
                "shape_table_size must be at most {}",
                crate::refusals::MAX_SHAPES
            ));
        }
        if self.digest_table_size > crate::digest::MAX_DIGESTS {
            return bad(&format!(
                "digest_table_size must be at most {}",
                crate::digest::MAX_DIGESTS
            ));
        }
        if self.admin.is_some() && self.admin_user.is_empty() {
            return bad("admin_user must not be empty");
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return bad("tls_cert and tls_key must be given together");
        }
        if self.tls_required && self.tls_cert.is_none() {
            return bad("tls_required needs tls_cert and tls_key");
        }
        if self.backend_tls == BackendTlsMode::Off {
            if self.backend_tls_ca.is_some()
                || self.backend_tls_insecure
                || self.backend_tls_server_name.is_some()
            {
                return bad(
                    "backend_tls_ca, backend_tls_insecure and backend_tls_server_name need \
                     backend_tls = preferred or required",
                );
            }
        } else if self.backend_tls_ca.is_none() && !self.backend_tls_insecure {
            return bad(
                "backend_tls verifies the backend's certificate: give backend_tls_ca (PEM CA \
                 file), or backend_tls_insecure = true to skip verification",
            );
        }
        Ok(self)
    }
}

/// The addresses of a `backend` setting: comma-separated, blanks trimmed, empty
/// entries skipped.
pub fn parse_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rules_unless_given() {
        let c = Config::resolve(Overrides::default(), FileConfig::default()).unwrap();
        assert_eq!(c.rules, None);
        let file = FileConfig::from_str("rules = \"/etc/heatsink/rules\"\n", "t").unwrap();
        let c = Config::resolve(Overrides::default(), file).unwrap();
        assert_eq!(c.rules, Some(PathBuf::from("/etc/heatsink/rules")));
        let maintain = Overrides {
            maintain_url: Some(Secret("mysql://u:p@h/db".into())),
            ..Default::default()
        };
        let e = Config::resolve(maintain.clone(), FileConfig::default()).unwrap_err();
        assert!(e.to_string().contains("needs rules"), "{e}");
        let with_rules = Overrides {
            rules: Some(PathBuf::from("rules")),
            ..maintain
        };
        assert!(Config::resolve(with_rules, FileConfig::default()).is_ok());
    }

    #[test]
    fn precedence_flag_over_file_over_default() {
        let file = FileConfig::from_str(
            "listen = \"127.0.0.1:1\"\nbackend = \"b:2\"\nmax_connections = 7\n",
            "t",
        )
        .unwrap();
        let cli = Overrides {
            listen: Some("127.0.0.1:9".into()),
            ..Default::default()
        };
        let c = Config::resolve(cli, file).unwrap();
        assert_eq!(c.listen, "127.0.0.1:9");
        assert_eq!(c.backend, "b:2");
        assert_eq!(c.max_connections, 7);
        assert_eq!(c.drain_timeout, Duration::from_secs(30));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        let e = FileConfig::from_str("listn = \"x\"\n", "heatsink.toml").unwrap_err();
        assert!(e.to_string().contains("heatsink.toml"), "{e}");
        assert!(e.to_string().contains("listn"), "{e}");
        let file = FileConfig::from_str("max_connections = 0\n", "t").unwrap();
        assert!(Config::resolve(Overrides::default(), file).is_err());
    }

    #[test]
    fn runtime_from_file_and_flag() {
        let c = Config::resolve(Overrides::default(), FileConfig::default()).unwrap();
        assert_eq!((c.runtime, c.runtime_threads), (RuntimeMode::Shared, None));
        let file =
            FileConfig::from_str("runtime = \"per-core\"\nruntime_threads = 3\n", "t").unwrap();
        let c = Config::resolve(Overrides::default(), file).unwrap();
        assert_eq!(
            (c.runtime, c.runtime_threads),
            (RuntimeMode::PerCore, Some(3))
        );
        let flag = Overrides {
            runtime: Some(RuntimeMode::Shared),
            ..Default::default()
        };
        let file = FileConfig::from_str("runtime = \"per-core\"\n", "t").unwrap();
        assert_eq!(
            Config::resolve(flag, file).unwrap().runtime,
            RuntimeMode::Shared
        );
        let file = FileConfig::from_str("runtime_threads = 0\n", "t").unwrap();
        assert!(Config::resolve(Overrides::default(), file).is_err());
        assert!(FileConfig::from_str("runtime = \"percore\"\n", "t").is_err());
    }

    #[test]
    fn sched_policy_from_file_and_flag() {
        let c = Config::resolve(Overrides::default(), FileConfig::default()).unwrap();
        assert_eq!(c.sched_policy, SchedPolicy::Inherit);
        let file = FileConfig::from_str("sched_policy = \"batch\"\n", "t").unwrap();
        let c = Config::resolve(Overrides::default(), file).unwrap();
        assert_eq!(c.sched_policy, SchedPolicy::Batch);
        let file = FileConfig::from_str("sched_policy = \"batch\"\n", "t").unwrap();
        let flag = Overrides {
            sched_policy: Some(SchedPolicy::Inherit),
            ..Default::default()
        };
        assert_eq!(
            Config::resolve(flag, file).unwrap().sched_policy,
            SchedPolicy::Inherit
        );
        assert!(FileConfig::from_str("sched_policy = \"fifo\"\n", "t").is_err());
    }

    #[test]
    fn shape_table_size_from_file_and_flag() {
        let c = Config::resolve(Overrides::default(), FileConfig::default()).unwrap();
        assert_eq!(c.shape_table_size, crate::refusals::DEFAULT_SHAPES);
        let file = FileConfig::from_str("shape_table_size = 50\n", "t").unwrap();
        let c = Config::resolve(Overrides::default(), file).unwrap();
        assert_eq!(c.shape_table_size, 50);
        let flag = Overrides {
            shape_table_size: Some(0),
            ..Default::default()
        };
        let file = FileConfig::from_str("shape_table_size = 50\n", "t").unwrap();
        assert_eq!(Config::resolve(flag, file).unwrap().shape_table_size, 0);
        let huge = Overrides {
            shape_table_size: Some(crate::refusals::MAX_SHAPES + 1),
            ..Default::default()
        };
        let e = Config::resolve(huge, FileConfig::default()).unwrap_err();
        assert!(e.to_string().contains("shape_table_size"), "{e}");
    }

    #[test]
    fn tls_settings() {
        let file = FileConfig::from_str(
            "tls_cert = \"c.pem\"\ntls_key = \"k.pem\"\nbackend_tls = \"required\"\nbackend_tls_ca = \"ca.pem\"\n",
            "t",
        )
        .unwrap();
        let c = Config::resolve(Overrides::default(), file).unwrap();
        assert_eq!(c.backend_tls, BackendTlsMode::Required);
        assert_eq!(c.tls_key.as_deref(), Some(Path::new("k.pem")));
        assert!(!c.tls_required);
        let only_cert = Overrides {
            tls_cert: Some("c.pem".into()),
            ..Default::default()
        };
        let e = Config::resolve(only_cert, FileConfig::default()).unwrap_err();
        assert!(e.to_string().contains("together"), "{e}");
        let unverified = Overrides {
            backend_tls: Some(BackendTlsMode::Preferred),
            ..Default::default()
        };
        let e = Config::resolve(unverified.clone(), FileConfig::default()).unwrap_err();
        assert!(e.to_string().contains("backend_tls_ca"), "{e}");
        let insecure = Overrides {
            backend_tls_insecure: Some(true),
            ..unverified
        };
        assert!(Config::resolve(insecure, FileConfig::default()).is_ok());
        let stray_ca = Overrides {
            backend_tls_ca: Some("ca.pem".into()),
            ..Default::default()
        };
        assert!(Config::resolve(stray_ca, FileConfig::default()).is_err());
        let required = Overrides {
            tls_required: Some(true),
            ..Default::default()
        };
        assert!(Config::resolve(required, FileConfig::default()).is_err());
    }

    #[test]
    fn several_backends_and_health_settings() {
        let file = FileConfig::from_str(
            "backend = \"10.0.0.1:3306, 10.0.0.2:3306,10.0.0.3:3306\"\nbackend_policy = \"first\"\n\
             health_interval_ms = 250\nhealth_user = \"hc\"\nhealth_password = \"pw\"\n",
            "f",
        )
        .unwrap();
        let c = Config::resolve(Overrides::default(), file).unwrap();
        assert_eq!(c.backend_policy, BackendPolicy::First);
        assert_eq!(c.health_interval, Duration::from_millis(250));
        assert_eq!(c.health_timeout, Duration::from_millis(1000));
        assert_eq!(c.health_user.as_deref(), Some("hc"));
        assert_eq!(c.health_password.0, "pw");
        assert_eq!(parse_list(&c.backend).len(), 3);
        // The default policy, and refusals.
        let c = Config::resolve(Overrides::default(), FileConfig::default()).unwrap();
        assert_eq!(c.backend_policy, BackendPolicy::LeastConnections);
        let empty = Overrides {
            backend: Some(" , ".into()),
            ..Overrides::default()
        };
        assert!(Config::resolve(empty, FileConfig::default()).is_err());
        let zero = Overrides {
            health_interval_ms: Some(0),
            ..Overrides::default()
        };
        assert!(Config::resolve(zero, FileConfig::default()).is_err());
        assert!(FileConfig::from_str("backend_policy = \"random\"\n", "f").is_err());
    }

    #[test]
    fn max_client_packet() {
        let c = Config::resolve(Overrides::default(), FileConfig::default()).unwrap();
        assert_eq!(c.max_client_packet, None);
        let file = FileConfig::from_str("max_client_packet = 4194304\n", "t").unwrap();
        let c = Config::resolve(Overrides::default(), file).unwrap();
        assert_eq!(c.max_client_packet, Some(4 << 20));
        for bad in [0, 1023, (1 << 30) + 1] {
            let cli = Overrides {
                max_client_packet: Some(bad),
                ..Default::default()
            };
            let e = Config::resolve(cli, FileConfig::default()).unwrap_err();
            assert!(e.to_string().contains("max_client_packet"), "{e}");
        }
    }

    #[test]
    fn admin_credentials() {
        let file = FileConfig::from_str(
            "admin = \"127.0.0.1:6032\"\nadmin_password = \"s3cret\"\n",
            "t",
        )
        .unwrap();
        let c = Config::resolve(Overrides::default(), file).unwrap();
        assert_eq!(c.admin_user, "admin");
        assert_eq!(c.admin_password.0, "s3cret");
        assert!(!format!("{c:?}").contains("s3cret"));
        let cli = Overrides {
            admin_user: Some("ops".into()),
            admin_password: Some(Secret("pw".into())),
            ..Default::default()
        };
        let c = Config::resolve(cli, FileConfig::default()).unwrap();
        assert_eq!(
            (c.admin_user.as_str(), c.admin_password.0.as_str()),
            ("ops", "pw")
        );
    }
}
