//! What every session of one server shares: configuration, the rule set in force,
//! counters, the live-session registry, the group-commit coordinator, TLS material
//! and the backend nodes. Read by the admin port, metrics and reload; written by the
//! sessions.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::state::AloneReason;
use crate::admin::Registry;
use crate::config::Config;
use crate::metrics::{Histogram, RuleTable};
use crate::rewrite::Engine;
use crate::tls::Tls;

/// Counters shared by all sessions (read by metrics and the admin port).
#[derive(Debug, Default)]
pub struct Stats {
    /// Client connections accepted.
    pub connections_total: AtomicU64,
    /// Client connections open now.
    pub connections_active: AtomicU64,
    /// Connections refused by the connection limit.
    pub connections_refused: AtomicU64,
    /// Connections whose backend could not be reached.
    pub backend_connect_errors: AtomicU64,
    /// Statements forwarded unchanged.
    pub passthrough: AtomicU64,
    /// Statements replaced by a rule.
    pub rewritten: AtomicU64,
    /// Statements rejected by a rule.
    pub rejected: AtomicU64,
    /// Merged writes (group commit) holding more than one statement.
    pub coalesced_writes: AtomicU64,
    /// Items (of each rule kind) that were part of a merged write.
    pub coalesced_items: crate::metrics::MergedItems,
    /// Writes that could have merged and ran alone, by [`AloneReason`] (index
    /// [`AloneReason::index`]).
    pub merge_alone: [AtomicU64; AloneReason::ALL.len()],
    /// Two-step rewrites (see [`crate::rewrite::Prelude`]) that ran with literals.
    pub prelude_literal: AtomicU64,
    /// Two-step rewrites whose prelude row did not allow literals: the one-step form ran.
    pub prelude_declined: AtomicU64,
    /// Backend responses that were ERR packets, and backend connections lost while a
    /// statement was in flight.
    pub backend_errors: AtomicU64,
    /// Rule set reloads that were swapped in.
    pub reloads_ok: AtomicU64,
    /// Rule set reloads refused (the previous rule set stayed in force).
    pub reloads_failed: AtomicU64,
    /// Rewritten statements: decision to the client's answer.
    pub rewrite_latency: Histogram,
    /// Passthrough statements (COM_QUERY, COM_STMT_EXECUTE): forwarding to the end
    /// of the response.
    pub backend_latency: Histogram,
}

/// State shared by every session of one server.
pub struct Shared {
    /// Effective configuration.
    pub config: Config,
    /// The rule set in force; a reload swaps in a new one, a statement sees one.
    pub engine: ArcSwap<Engine>,
    /// Counters.
    pub stats: Stats,
    /// Per-rule counters of the rule set in force (replaced with the engine on reload,
    /// looked up by rule name).
    pub rules: ArcSwap<RuleTable>,
    /// Live sessions, for the admin port's `SHOW SESSIONS`.
    pub sessions: Registry,
    /// Group commit of merged writes.
    pub coalescer: Arc<super::coalesce::Coalescer>,
    /// TLS material loaded at startup (client certificate, backend trust).
    pub tls: Tls,
    /// The backend nodes, their health and connections.
    pub backends: Arc<crate::backends::Backends>,
    /// Refused and fallback statements by shape (`SHOW REFUSALS`, `SHOW FALLBACKS`).
    pub shapes: crate::refusals::Shapes,
    /// Query digests of all traffic (`SHOW DIGESTS`).
    pub digests: crate::digest::Digests,
    /// Whether merged writes' tables have triggers or defaults that read the
    /// connection, per table.
    pub merge_tables: super::MergeTables,
}

impl Shared {
    /// Shared state for a server with `config` and an initial rule set, without TLS.
    pub fn new(config: Config, engine: Engine) -> Arc<Self> {
        Self::with_tls(config, engine, Tls::default())
    }

    /// Shared state with TLS material loaded from `config` ([`Tls::load`]).
    pub fn with_tls(config: Config, engine: Engine, tls: Tls) -> Arc<Self> {
        let rules = RuleTable::for_engine(&engine, &RuleTable::default());
        let backends = Arc::new(crate::backends::Backends::from_config(&config));
        let shapes = crate::refusals::Shapes::new(config.shape_table_size);
        let digests = crate::digest::Digests::new(config.digest_table_size);
        Arc::new(Shared {
            shapes,
            digests,
            backends,
            config,
            engine: ArcSwap::from_pointee(engine),
            stats: Stats::default(),
            rules: ArcSwap::from_pointee(rules),
            sessions: Registry::default(),
            coalescer: Arc::default(),
            merge_tables: super::MergeTables::default(),
            tls,
        })
    }

    /// Swaps in a new rule set: its per-rule counters first (carrying over those of
    /// rules that keep their name), then the engine. A statement already deciding
    /// keeps the engine it loaded.
    pub fn install(&self, engine: Engine) {
        let table = RuleTable::for_engine(&engine, &self.rules.load());
        self.rules.store(Arc::new(table));
        self.engine.store(Arc::new(engine));
        // A reload is also how a DBA says the schema changed: tables are read again.
        self.merge_tables.clear();
    }
}
