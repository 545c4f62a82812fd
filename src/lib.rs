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
//!   fingerprints, plan cache, the [`rewrite::Rule`] trait rule kinds implement.
//! - [`rules`]: rule files — loading, validation, building an engine.
//! - [`server`]: accept loop, connection limit, graceful shutdown.
//! - [`metrics`]: the `/metrics`, `/healthz` and `/readyz` HTTP endpoint.
//! - [`migrate`] and [`compact`]: maintenance commands for counter rules — create
//!   slot tables and triggers, fold slot deltas back into the base values.
//! - [`config`] and [`cli`]: settings (flag > env > file > default) and subcommands.
//! - [`error`]: errors tagged with their source (client, backend, rules, internal).
//!
//! The design decisions behind this (packet relay rather than decode/re-encode, what is
//! parsed and when) are recorded in `docs/design.md`.

pub mod cli;
pub mod compact;
pub mod config;
pub mod error;
pub mod metrics;
pub mod migrate;
pub mod relay;
pub mod rewrite;
pub mod rules;
pub mod server;
pub mod wire;

use std::sync::Arc;

use tracing::info;

use crate::config::{Config, LogFormat};
use crate::error::{Error, Result, Source};

/// Runs the command the user asked for.
pub fn run(cli: cli::Cli) -> Result<()> {
    match cli.command {
        cli::Command::Serve(args) => {
            let config = args.resolve()?;
            init_logging(&config);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("heatsink")
                .build()
                .map_err(|e| Error::with_cause(Source::Internal, "starting runtime", e))?;
            rt.block_on(serve(config, server::shutdown_signal()))
        }
        cli::Command::Health { url } => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::with_cause(Source::Internal, "starting runtime", e))?
            .block_on(metrics::probe(&url)),
        cli::Command::Migrate(args) => {
            let opts = migrate::MigrateOptions {
                rules: &args.rules,
                backend_url: &args.backend_url,
                apply: args.apply,
                rule: args.rule.as_deref(),
            };
            maintenance_runtime()?.block_on(migrate::run(&opts, &mut std::io::stdout().lock()))
        }
        cli::Command::Compact(args) => {
            let opts = compact::CompactOptions {
                rules: &args.rules,
                backend_url: &args.backend_url,
                rule: args.rule.as_deref(),
                batch: args.batch,
            };
            maintenance_runtime()?.block_on(compact::run(&opts, &mut std::io::stdout().lock()))
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
    let engine = rules::load(&config.rules, config.plan_cache_size)?;
    let listener = server::bind(&config.listen).await?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::with_cause(Source::Internal, "reading listen address", e))?;
    info!(
        backend = %config.backend,
        rules = %config.rules.display(),
        rules_loaded = engine.has_rules(),
        "listening on {addr}"
    );
    let metrics = match &config.metrics {
        Some(a) => Some(server::bind(a).await?),
        None => None,
    };
    let shared = relay::Shared::new(config, engine);
    if let Some(l) = metrics {
        tokio::spawn(metrics::serve(l, Arc::clone(&shared)));
    }
    server::run(listener, Arc::clone(&shared), shutdown).await
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
