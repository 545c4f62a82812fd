//! heatsink: a MySQL wire-protocol proxy that rewrites hot-spot statements into shapes
//! the database handles well, following rule files that DBAs edit. Everything else
//! passes through byte for byte.
//!
//! # Layout
//!
//! - [`wire`]: MySQL packet framing and the few packets the proxy reads or patches.
//! - [`relay`]: the data path — one task per client, a 1:1 backend connection, the
//!   response state machine, and the hook where rewritten statements are spliced in.
//! - [`rewrite`]: the rewrite engine — pre-filter on ruled table names, tokenizer and
//!   fingerprints, plan cache, shape guards, the [`rewrite::Rule`] and
//!   [`rewrite::Merger`] traits rule kinds implement.
//! - [`kinds`]: the rule kinds, one folder each (`counter`, `ring`, `rollup`), each owning its
//!   rule-file section, planner, group-commit merge, schema work and maintenance
//!   jobs; [`kinds::KINDS`] is the registry every driver loops over.
//! - [`rules`]: rule files — reading them through the registry, validation, building
//!   an engine.
//! - [`server`]: accept loop, connection limit, graceful shutdown, and the threads
//!   sessions run on (one shared runtime, or one runtime per core).
//! - [`backends`]: the backend nodes (a list for a cluster), which node a client
//!   connection gets, and the health checker.
//! - [`tls`]: TLS towards clients (terminated by the proxy) and towards the backend;
//!   the socket type of both legs.
//! - [`reload`]: hot reload of the rule set (file watch, SIGHUP, admin command):
//!   parse and validate everything, then swap, or keep the previous set.
//! - [`admin`]: the admin port (MySQL protocol): rules, per-rule stats, sessions,
//!   reload, explain; and the registry of live sessions it lists.
//! - [`metrics`]: the `/metrics`, `/healthz` and `/readyz` HTTP endpoint, latency
//!   histograms and per-rule counters.
//! - [`migrate`], [`maintain`], [`check`] and [`explain`]: rules as a DBA's tool —
//!   create the tables and triggers rules need, run their maintenance jobs, validate a
//!   rule set (also against the live schema) and run its test cases, show what the
//!   proxy would do with a statement. Drivers over [`kinds::RuleSpec`]: none names a
//!   kind.
//! - [`schema`]: the live schema as kinds' schema work reads it.
//! - [`config`] and [`cli`]: settings (flag > env > file > default) and subcommands.
//! - [`error`]: errors tagged with their source (client, backend, rules, internal).
//!
//! The design decisions behind this (packet relay rather than decode/re-encode, what is
//! parsed and when) are recorded in `docs/design.md`.

pub mod admin;
pub mod advice;
pub mod advise;
pub mod backends;
pub mod check;
pub mod cli;

pub mod config;
pub mod digest;
pub mod error;
pub mod explain;
pub mod jobs;
pub mod kinds;
pub mod maintain;
pub mod metrics;
pub mod migrate;
pub mod refusals;
pub mod registry;
pub mod relay;
pub mod reload;
pub mod report;
pub mod revert;
pub mod rewrite;
pub mod rules;
pub mod schema;
pub mod server;
pub mod tls;
pub mod wire;

use std::sync::Arc;

use tracing::info;

use crate::config::{Config, LogFormat};
use crate::error::{Error, Result, Source};

/// Stack of each runtime thread. Planning a statement recurses along its expression
/// depth (parser, visitors, printer, drop), which the engine bounds by
/// [`rewrite::MAX_NESTING`]; at that bound a debug build uses about half of
/// this, a release build far less. Pages are only touched as used.
pub const WORKER_STACK_BYTES: usize = 16 << 20;

/// The package version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit the binary was built from, or empty when the build did not know it
/// (no `.git` and no `HEATSINK_GIT_COMMIT`; see `build.rs`).
pub const GIT_COMMIT: &str = env!("HEATSINK_GIT_COMMIT");
/// What `heatsink --version` prints after the name: the version, and the commit's
/// first 12 digits when known.
pub const VERSION_LONG: &str = env!("HEATSINK_VERSION_LONG");

/// Runs the command the user asked for.
pub fn run(cli: cli::Cli) -> Result<()> {
    match cli.command {
        cli::Command::Serve(args) => {
            let config = args.resolve()?;
            init_logging(&config);
            server::runtime(&config)?.block_on(serve(config, server::shutdown_signal()))
        }
        cli::Command::Health { url } => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::with_cause(Source::Internal, "starting runtime", e))?
            .block_on(metrics::probe(&url)),
        cli::Command::Migrate(args) if args.revert.is_some() => {
            if !(0.0..=3600.0).contains(&args.observe) {
                return Err(Error::new(
                    Source::Rules,
                    format!(
                        "--observe must be between 0 and 3600 seconds, not {}",
                        args.observe
                    ),
                ));
            }
            let opts = revert::RevertOptions {
                rules: &args.rules,
                backend_url: &args.backend_url,
                rule: args.revert.as_deref().unwrap_or_default(),
                apply: args.apply,
                observe: std::time::Duration::from_secs_f64(args.observe),
                batch: args.batch,
                jobs: args.jobs.settings()?,
            };
            maintenance_runtime()?.block_on(revert::run(&opts, &mut std::io::stdout().lock()))
        }
        cli::Command::Migrate(args) => {
            let opts = migrate::MigrateOptions {
                rules: &args.rules,
                backend_url: &args.backend_url,
                apply: args.apply,
                rule: args.rule.as_deref(),
                print_grants: args.print_grants,
                jobs: args.jobs.settings()?,
                defer_jobs: args.defer_jobs,
            };
            maintenance_runtime()?.block_on(migrate::run(&opts, &mut std::io::stdout().lock()))
        }
        cli::Command::Compact(args) => {
            let opts = maintain::MaintainOptions {
                rules: &args.rules,
                backend_url: &args.backend_url,
                rule: args.rule.as_deref(),
                job: Some("compact"),
                batch: args.batch,
                apply: true,
                jobs: Default::default(),
            };
            maintenance_runtime()?.block_on(maintain::run(&opts, &mut std::io::stdout().lock()))
        }
        cli::Command::Maintain(args) => {
            let opts = maintain::MaintainOptions {
                rules: &args.rules,
                backend_url: &args.backend_url,
                rule: args.rule.as_deref(),
                job: args.job.as_deref(),
                batch: args.batch,
                apply: args.apply,
                jobs: args.jobs.settings()?,
            };
            maintenance_runtime()?.block_on(maintain::run(&opts, &mut std::io::stdout().lock()))
        }
        cli::Command::Check(args) => {
            let opts = check::CheckOptions {
                rules: &args.rules,
                backend_url: args.backend_url.as_deref(),
                db: args.db.as_deref(),
                format: args.format,
            };
            maintenance_runtime()?.block_on(check::run(&opts, &mut std::io::stdout().lock()))
        }
        cli::Command::Advise(args) => {
            let source = match (&args.admin, &args.digests) {
                (Some(url), _) => advise::AdviseSource::Admin(url),
                (None, Some(path)) => advise::AdviseSource::Digests(path),
                (None, None) => advise::AdviseSource::PerformanceSchema,
            };
            let opts = advise::AdviseOptions {
                source,
                backend_url: args.backend_url.as_deref(),
                db: args.db.as_deref(),
                thresholds: advice::Thresholds {
                    large_rows: args.large_rows,
                    hot_share: args.hot_share,
                    min_share: args.min_share,
                },
                format: args.format,
            };
            maintenance_runtime()?.block_on(advise::run(&opts, &mut std::io::stdout().lock()))
        }
        cli::Command::Explain(args) => {
            let opts = explain::ExplainOptions {
                rules: &args.rules,
                backend_url: args.backend_url.as_deref(),
                db: args.db.as_deref(),
                format: args.format,
                sql: &args.sql,
            };
            maintenance_runtime()?.block_on(explain::run(
                &opts,
                &mut std::io::stdin().lock(),
                &mut std::io::stdout().lock(),
            ))
        }
    }
}

/// A single-threaded runtime for the maintenance commands (one connection each).
fn maintenance_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::with_cause(Source::Internal, "starting runtime", e))
}

/// Starts the proxy with `config` and serves until `shutdown` resolves.
pub async fn serve(config: Config, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let (snapshot, engine) = match &config.rules {
        Some(path) => reload::load(path, config.plan_cache_size),
        None => (reload::Snapshot::none(), Ok(rewrite::Engine::empty())),
    };
    let engine = engine?;
    let tls = tls::Tls::load(&config)?;
    let shared = relay::Shared::with_tls(config, engine, tls);
    let config = &shared.config;
    log_tls(config);
    // Everything that can refuse to start, and the SIGHUP handler, comes before the
    // listener: once clients can connect, a reload signal must not kill the process.
    let admin = admin::bind(&shared).await?;
    let metrics = match &config.metrics {
        Some(a) => Some(server::bind(a).await?),
        None => None,
    };
    let reloader = reload::Reloader::new(Arc::clone(&shared), &snapshot);
    reload::on_sighup(Arc::clone(&reloader))?;
    // The first health check, so that the first clients and `/readyz` see it.
    let health_config = Arc::new(config.clone());
    backends::check_all(&shared.backends, &health_config).await;
    let listeners = server::Listeners::bind(config).await?;
    let addr = listeners.local_addr()?;
    let rules = match &config.rules {
        Some(p) => p.display().to_string(),
        None => "none".to_string(),
    };
    info!(
        version = VERSION,
        commit = if GIT_COMMIT.is_empty() { "unknown" } else { GIT_COMMIT },
        backend = %config.backend,
        unix_socket = %config.listen_unix.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "none".into()),
        rules = %rules,
        rules_loaded = shared.engine.load().has_rules(),
        runtime = ?config.runtime,
        threads = server::threads(config),
        rule_names = ?reloader.catalog().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        "listening on {addr}{}",
        if config.rules.is_none() {
            " with no rules (no --rules given): a pure passthrough, every statement is forwarded unchanged"
        } else {
            ""
        }
    );
    // Without a rules path there are no files to watch.
    let watcher = config
        .rules
        .is_some()
        .then(|| tokio::spawn(reload::watch(Arc::clone(&reloader), reload::POLL_INTERVAL)));
    if let Some(l) = metrics {
        tokio::spawn(metrics::serve(l, Arc::clone(&shared)));
    }
    if let Some(l) = admin {
        tokio::spawn(admin::serve(l, Arc::clone(&shared), reloader));
    }
    if let (Some(url), Some(rules)) = (&config.maintain_url, &config.rules) {
        maintain::periodic(
            rules.clone(),
            url.0.clone(),
            config.maintain_interval,
            config.max_rows_per_second,
        )?;
    }
    let health = tokio::spawn(backends::health_loop(
        Arc::clone(&shared.backends),
        health_config,
    ));
    let served = server::run(listeners, Arc::clone(&shared), shutdown).await;
    if let Some(w) = watcher {
        w.abort();
    }
    health.abort();
    served
}

/// Says at startup what TLS does on each leg; warns about unverified backends.
fn log_tls(config: &Config) {
    use tracing::warn;
    let clients = match (&config.tls_cert, config.tls_required) {
        (None, _) => "off",
        (Some(_), false) => "offered",
        (Some(_), true) => "required",
    };
    let backend = match config.backend_tls {
        config::BackendTlsMode::Off => "off",
        config::BackendTlsMode::Preferred => "preferred",
        config::BackendTlsMode::Required => "required",
    };
    if clients != "off" || backend != "off" {
        info!(clients, backend, "TLS");
    }
    if config.backend_tls != config::BackendTlsMode::Off && config.backend_tls_insecure {
        warn!(
            "backend_tls_insecure: the backend's certificate is NOT verified; the backend \
             connection is encrypted but anyone on the path can impersonate the backend"
        );
    }
}

fn init_logging(config: &Config) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match config.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Human => builder.try_init(),
    };
}
