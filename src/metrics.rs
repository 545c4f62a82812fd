//! The `--metrics` HTTP endpoint: `/metrics` (Prometheus text format), `/digests`
//! (the query digests as a JSON array, see [`crate::digest`]), `/healthz`
//! (the process is serving) and `/readyz` (at least one backend node is up, as the
//! health checker of [`crate::backends`] sees it; the body lists every node).
//!
//! A deliberately tiny HTTP/1.1 responder on tokio: one request per connection,
//! GET only, no dependencies.
//!
//! Also home of the counters that are more than one number: [`Histogram`] (fixed
//! buckets, lock-free) and the per-rule [`RuleStats`] in a [`RuleTable`] that is
//! rebuilt whenever the rule set is reloaded.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

use crate::error::{Error, Result, Source};
use crate::relay::Shared;
use crate::rewrite::merge::MergeMetric;

/// Renders every counter in Prometheus text exposition format.
pub fn render(shared: &Shared) -> String {
    let s = &shared.stats;
    let mut out = String::with_capacity(1024);
    write_build_info(&mut out);
    // (name, help, type, value) of the metrics that are a single number.
    let scalars = [
        (
            "heatsink_connections_total",
            "Client connections accepted.",
            "counter",
            s.connections_total.load(Relaxed),
        ),
        (
            "heatsink_connections_active",
            "Client connections open now.",
            "gauge",
            s.connections_active.load(Relaxed),
        ),
        (
            "heatsink_connections_refused_total",
            "Client connections refused by max_connections.",
            "counter",
            s.connections_refused.load(Relaxed),
        ),
        (
            "heatsink_backend_connect_errors_total",
            "Backend connections that could not be opened.",
            "counter",
            s.backend_connect_errors.load(Relaxed),
        ),
        (
            "heatsink_coalesced_writes_total",
            "Merged writes (group commit) holding more than one statement.",
            "counter",
            s.coalesced_writes.load(Relaxed),
        ),
    ];
    for (name, help, kind, v) in scalars {
        write_scalar(&mut out, name, help, kind, v);
    }
    for (metric, v) in s.coalesced_items.iter() {
        write_scalar(&mut out, metric.name, metric.help, "counter", v);
    }
    write_labelled(
        &mut out,
        ("heatsink_statements_total", "Statements by outcome."),
        "outcome",
        &[
            ("passthrough", s.passthrough.load(Relaxed)),
            ("rewritten", s.rewritten.load(Relaxed)),
            ("rejected", s.rejected.load(Relaxed)),
        ],
    );
    write_labelled(
        &mut out,
        (
            "heatsink_prelude_total",
            "Two-step rewrites (a read whose bounds the server computes first) by the form that ran: with the computed values as literals, or declined to the one-step form.",
        ),
        "outcome",
        &[
            ("literal", s.prelude_literal.load(Relaxed)),
            ("declined", s.prelude_declined.load(Relaxed)),
        ],
    );
    let alone: Vec<(&str, u64)> = crate::relay::state::AloneReason::ALL
        .iter()
        .map(|r| (r.label(), s.merge_alone[r.index()].load(Relaxed)))
        .collect();
    write_labelled(
        &mut out,
        (
            "heatsink_merge_alone_total",
            "Writes that group commit could have merged and that ran alone on their own connection, by reason.",
        ),
        "reason",
        &alone,
    );
    let table = shared.rules.load();
    write_rule_statements(&mut out, &table);
    write_shapes(&mut out, &shared.shapes);
    write_digests(&mut out, &shared.digests);
    write_labelled(
        &mut out,
        ("heatsink_rule_reloads_total", "Rule set reloads by result."),
        "result",
        &[
            ("ok", s.reloads_ok.load(Relaxed)),
            ("error", s.reloads_failed.load(Relaxed)),
        ],
    );
    write_scalar(
        &mut out,
        "heatsink_rules_loaded",
        "Rules in the rule set in force.",
        "gauge",
        table.len() as u64,
    );
    write_scalar(
        &mut out,
        "heatsink_backend_errors_total",
        "Backend responses that were errors, and backend connections lost mid-statement.",
        "counter",
        s.backend_errors.load(Relaxed),
    );
    write_backends(&mut out, &shared.backends.views());
    crate::jobs::gauges::render(&mut out, label_value);
    s.rewrite_latency.render(
        &mut out,
        "heatsink_rewrite_duration_seconds",
        "Rewritten statements: from the decision to the client's answer.",
    );
    s.backend_latency.render(
        &mut out,
        "heatsink_backend_duration_seconds",
        "Passthrough statements: from forwarding to the end of the backend's response.",
    );
    out
}

/// Per backend node: up (1) or down (0), client connections now and since start,
/// failed connection attempts and health checks.
fn write_backends(out: &mut String, nodes: &[crate::backends::NodeView]) {
    type Metric<'a> = (
        &'a str,
        &'a str,
        &'a str,
        fn(&crate::backends::NodeView) -> u64,
    );
    let metrics: [Metric<'_>; 4] = [
        (
            "heatsink_backend_up",
            "Backend node takes new connections (1) or not (0).",
            "gauge",
            |n| u64::from(n.up),
        ),
        (
            "heatsink_backend_connections",
            "Client connections relayed to the backend node now.",
            "gauge",
            |n| n.connections,
        ),
        (
            "heatsink_backend_connections_total",
            "Client connections relayed to the backend node since start.",
            "counter",
            |n| n.connections_total,
        ),
        (
            "heatsink_backend_node_errors_total",
            "Failed connection attempts and health checks of the backend node.",
            "counter",
            |n| n.errors,
        ),
    ];
    for (name, help, kind, get) in metrics {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for n in nodes {
            let addr = n.addr.replace(['\\', '"'], "_");
            let _ = writeln!(out, "{name}{{backend=\"{addr}\"}} {}", get(n));
        }
    }
}

/// Writes a metric that is one number: its `HELP` and `TYPE` lines and its value.
fn write_scalar(out: &mut String, name: &str, help: &str, kind: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
    );
}

/// Writes a counter with one label: its `HELP` and `TYPE` lines, then a sample per
/// `(label value, count)`.
fn write_labelled(out: &mut String, (name, help): (&str, &str), label: &str, v: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (value, v) in v {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {v}");
    }
}

/// Writes `heatsink_rule_statements_total`: per rule of `table`, the statements it
/// acted on by outcome.
fn write_rule_statements(out: &mut String, table: &RuleTable) {
    let _ = writeln!(
        out,
        "# HELP heatsink_rule_statements_total Statements a rule acted on, by rule and outcome.\n# TYPE heatsink_rule_statements_total counter"
    );
    for (name, r) in table.iter() {
        let name = label_value(name);
        for (outcome, v) in [
            ("rewritten", r.rewritten.load(Relaxed)),
            ("rejected", r.rejected.load(Relaxed)),
            ("error", r.errors.load(Relaxed)),
            ("shadow_rewrite", r.shadow_rewrites.load(Relaxed)),
            ("shadow_reject", r.shadow_rejects.load(Relaxed)),
            ("fallback", r.fallbacks.load(Relaxed)),
        ] {
            let _ = writeln!(
                out,
                "heatsink_rule_statements_total{{rule=\"{name}\",outcome=\"{outcome}\"}} {v}"
            );
        }
    }
}

/// The tables of `SHOW REFUSALS` and `SHOW FALLBACKS`: totals only (one series per
/// table, never one per shape).
/// How many digests `/metrics` shows by rank of total time.
pub const TOP_DIGESTS: usize = 5;

/// The query digests' summary: rows, capacity, evictions, statements by handling,
/// and the top [`TOP_DIGESTS`] digests by total time keyed by rank (never by text:
/// the label set stays fixed).
fn write_digests(out: &mut String, digests: &crate::digest::Digests) {
    use crate::digest::Handling;
    write_scalar(
        out,
        "heatsink_digests",
        "Rows held by SHOW DIGESTS now.",
        "gauge",
        digests.len() as u64,
    );
    write_scalar(
        out,
        "heatsink_digests_capacity",
        "Rows SHOW DIGESTS holds at most (digest_table_size; 0: digests off).",
        "gauge",
        digests.capacity() as u64,
    );
    write_scalar(
        out,
        "heatsink_digests_evicted_total",
        "Digest rows evicted (least recently seen first) to keep digest_table_size.",
        "counter",
        digests.evicted(),
    );
    let by: Vec<(&str, u64)> = Handling::ALL
        .iter()
        .map(|h| (h.label(), digests.recorded(*h)))
        .collect();
    write_labelled(
        out,
        (
            "heatsink_digest_statements_total",
            "Client statements counted in the query digests, by how heatsink handled them.",
        ),
        "handling",
        &by,
    );
    let top = crate::admin::sorted_digests(
        digests,
        &("sum_time_us".to_string(), true),
        Some(TOP_DIGESTS),
    );
    let series = [
        (
            "heatsink_digest_top_time_seconds",
            "Total time of the digests with the most total time, by rank (1: the most; SHOW DIGESTS names them).",
        ),
        (
            "heatsink_digest_top_count",
            "Executions of the digests with the most total time, by rank.",
        ),
    ];
    for (i, (name, help)) in series.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (rank, r) in top.iter().enumerate() {
            if i == 0 {
                let _ = writeln!(
                    out,
                    "{name}{{rank=\"{}\"}} {:.6}",
                    rank + 1,
                    r.sum_time_us as f64 / 1e6
                );
            } else {
                let _ = writeln!(out, "{name}{{rank=\"{}\"}} {}", rank + 1, r.count_star);
            }
        }
    }
}

fn write_shapes(out: &mut String, shapes: &crate::refusals::Shapes) {
    use crate::refusals::Kind;
    let tables = [Kind::Refusal, Kind::Fallback].map(|k| shapes.table(k));
    let _ = writeln!(
        out,
        "# HELP heatsink_shapes Statement shapes held by SHOW REFUSALS / SHOW FALLBACKS now.\n# TYPE heatsink_shapes gauge"
    );
    for t in tables {
        let _ = writeln!(
            out,
            "heatsink_shapes{{table=\"{}\"}} {}",
            t.kind().label(),
            t.len()
        );
    }
    let per_table = |f: fn(&crate::refusals::ShapeTable) -> u64| -> Vec<(&str, u64)> {
        tables.iter().map(|t| (t.kind().label(), f(t))).collect()
    };
    write_labelled(
        out,
        (
            "heatsink_shape_statements_total",
            "Refused (shadow mode's included) and fallback statements recorded by shape.",
        ),
        "table",
        &per_table(crate::refusals::ShapeTable::recorded),
    );
    write_labelled(
        out,
        (
            "heatsink_shapes_evicted_total",
            "Statement shapes evicted (least recently seen first) to keep shape_table_size.",
        ),
        "table",
        &per_table(crate::refusals::ShapeTable::evicted),
    );
    let by_class = shapes.refused_by_class();
    let by_class: Vec<(&str, u64)> = by_class.iter().map(|(c, n)| (c.label(), *n)).collect();
    write_labelled(
        out,
        (
            "heatsink_refusals_total",
            "Refused statements (shadow mode's included) by refusal class.",
        ),
        "class",
        &by_class,
    );
    write_scalar(
        out,
        "heatsink_shape_log_lines_held_back_total",
        "First-seen log lines of statement shapes held back by the per-minute cap.",
        "counter",
        shapes.log.held_back(),
    );
}

/// `heatsink_build_info{version,commit} 1`: which build this is (the commit is
/// `unknown` when the build did not know it).
fn write_build_info(out: &mut String) {
    let commit = if crate::GIT_COMMIT.is_empty() {
        "unknown"
    } else {
        crate::GIT_COMMIT
    };
    let _ = writeln!(
        out,
        "# HELP heatsink_build_info The running build: version and git commit (always 1).\n\
         # TYPE heatsink_build_info gauge\n\
         heatsink_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        label_value(crate::VERSION),
        label_value(commit)
    );
}

/// Escapes a Prometheus label value (backslash, double quote, newline).
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Upper bounds of the latency histogram buckets, in seconds (`+Inf` is implied).
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// The same bounds in nanoseconds, for the hot path.
const BUCKET_NS: [u64; 14] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
];

/// A latency histogram with the fixed [`LATENCY_BUCKETS`]; two relaxed atomic
/// additions per observation, no locks.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; 15],
    /// Sum of all observations, in nanoseconds.
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one duration.
    #[inline]
    pub fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = BUCKET_NS.partition_point(|&b| b < ns);
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// Appends the histogram in Prometheus text format.
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Relaxed);
            match LATENCY_BUCKETS.get(i) {
                Some(le) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let sum = self.sum_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
    }
}

/// Items (increments, rows, …) written as part of a merged write (group commit),
/// one counter per rule kind's [`MergeMetric`] (`crate::kinds::merge_metrics`),
/// each rendered under the kind's own name.
#[derive(Debug)]
pub struct MergedItems {
    counts: Vec<(&'static MergeMetric, AtomicU64)>,
}

impl Default for MergedItems {
    fn default() -> Self {
        MergedItems {
            counts: crate::kinds::merge_metrics()
                .map(|m| (m, AtomicU64::new(0)))
                .collect(),
        }
    }
}

impl MergedItems {
    /// Adds `n` to the counter of `metric` (one of `crate::kinds::merge_metrics`).
    pub fn add(&self, metric: &MergeMetric, n: u64) {
        if let Some((_, c)) = self.counts.iter().find(|(m, _)| m.name == metric.name) {
            c.fetch_add(n, Relaxed);
        }
    }

    /// Every counter with its value, in `crate::kinds::merge_metrics` order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static MergeMetric, u64)> + '_ {
        self.counts.iter().map(|(m, c)| (*m, c.load(Relaxed)))
    }
}

/// What one rule did since it was first loaded (counters survive reloads that keep
/// the rule's name).
#[derive(Debug, Default)]
pub struct RuleStats {
    /// Statements run in rewritten form: text statements, and executions of
    /// prepared statements the rule rewrote.
    pub rewritten: AtomicU64,
    /// Statements refused with the rule's error.
    pub rejected: AtomicU64,
    /// Shadow mode: statements the rule would have rewritten (forwarded unchanged).
    pub shadow_rewrites: AtomicU64,
    /// Shadow mode: statements the rule would have rejected (forwarded unchanged).
    pub shadow_rejects: AtomicU64,
    /// Statements the rule exists to answer but could not answer exactly, forwarded
    /// unchanged (a rollup read of a shape the rollup cannot answer).
    pub fallbacks: AtomicU64,
    /// Rewritten statements during which the backend returned an error (lock
    /// conflicts the proxy retried included) or the connection failed.
    pub errors: AtomicU64,
    /// Sum of the rewrite latencies, in nanoseconds.
    pub latency_sum_ns: AtomicU64,
    /// Largest rewrite latency, in nanoseconds.
    pub latency_max_ns: AtomicU64,
}

impl RuleStats {
    /// Statements the rule acted on (rewritten or rejected).
    pub fn matched(&self) -> u64 {
        self.rewritten.load(Relaxed) + self.rejected.load(Relaxed)
    }

    /// Records one rewritten statement: its latency (decision to the client's
    /// answer) and whether it ended in an error.
    #[inline]
    pub fn record_rewrite(&self, took: Duration, error: bool) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.rewritten.fetch_add(1, Relaxed);
        self.latency_sum_ns.fetch_add(ns, Relaxed);
        self.latency_max_ns.fetch_max(ns, Relaxed);
        if error {
            self.errors.fetch_add(1, Relaxed);
        }
    }

    /// Mean rewrite latency in microseconds (0 before the first rewrite).
    pub fn mean_latency_us(&self) -> f64 {
        match self.rewritten.load(Relaxed) {
            0 => 0.0,
            n => self.latency_sum_ns.load(Relaxed) as f64 / n as f64 / 1e3,
        }
    }

    /// Largest rewrite latency in microseconds.
    pub fn max_latency_us(&self) -> f64 {
        self.latency_max_ns.load(Relaxed) as f64 / 1e3
    }
}

/// Per-rule counters of one rule set, in the engine's rule order. Swapped together
/// with the engine on reload; sessions look a rule up by name, so a statement decided
/// under the previous set still finds its rule's counters if the rule kept its name.
#[derive(Debug, Default)]
pub struct RuleTable {
    /// `(rule name, counters)` in the order the engine consults the rules.
    rules: Vec<(Arc<str>, Arc<RuleStats>)>,
}

impl RuleTable {
    /// The table for `engine`'s rules, carrying over the counters of rules that keep
    /// their name from `previous`.
    pub fn for_engine(engine: &crate::rewrite::Engine, previous: &RuleTable) -> RuleTable {
        let rules = engine
            .rules()
            .iter()
            .map(|r| {
                let name: Arc<str> = Arc::from(r.name());
                let stats = previous
                    .rules
                    .iter()
                    .find(|(n, _)| **n == *name)
                    .map(|(_, s)| Arc::clone(s))
                    .unwrap_or_default();
                (name, stats)
            })
            .collect();
        RuleTable { rules }
    }

    /// The counters of the rule called `name`, if it is in this rule set.
    #[inline]
    pub fn get(&self, name: &str) -> Option<&RuleStats> {
        self.rules
            .iter()
            .find(|(n, _)| **n == *name)
            .map(|(_, s)| s.as_ref())
    }

    /// `(name, counters)` in rule order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &RuleStats)> {
        self.rules.iter().map(|(n, s)| (n.as_ref(), s.as_ref()))
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// True when there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// Serves the endpoint on `listener` forever.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    if let Ok(a) = listener.local_addr() {
        info!("metrics on http://{a}/metrics");
    }
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(sock, &shared).await {
                debug!(error = %e, "metrics request failed");
            }
        });
    }
}

async fn handle(mut sock: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let mut buf = vec![0u8; 2048];
    let mut n = 0;
    // Read the request head (bounded in size and time).
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        while n < buf.len() {
            let m = sock.read(&mut buf[n..]).await?;
            if m == 0 {
                break;
            }
            n += m;
            if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return Ok(());
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", render(shared)),
        ("GET", "/healthz") => ("200 OK", "ok\n".to_string()),
        // Every query digest as a JSON array (`heatsink advise --digests FILE`).
        ("GET", "/digests") => (
            "200 OK",
            crate::digest::json_array(&crate::admin::sorted_digests(
                &shared.digests,
                &("sum_time_us".to_string(), true),
                None,
            )),
        ),
        ("GET", "/readyz") => {
            // Ready while at least one backend node takes connections (the health
            // checker's view); the body lists every node.
            let mut body = String::new();
            for n in shared.backends.views() {
                let _ = writeln!(
                    body,
                    "{} {} ({}), {} connections",
                    n.addr,
                    if n.up { "up" } else { "down" },
                    n.detail,
                    n.connections
                );
            }
            if shared.backends.any_up() {
                ("200 OK", format!("ready\n{body}"))
            } else {
                (
                    "503 Service Unavailable",
                    format!("backend unreachable\n{body}"),
                )
            }
        }
        ("GET", _) => ("404 Not Found", "not found\n".to_string()),
        _ => ("405 Method Not Allowed", "GET only\n".to_string()),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(resp.as_bytes()).await?;
    sock.shutdown().await
}

/// `heatsink health --url http://host:port/healthz`: exit 0 when the endpoint answers
/// 200 within two seconds (used by container health checks).
pub async fn probe(url: &str) -> Result<()> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/healthz"),
    };
    let fail = |m: String| Error::new(Source::Internal, m);
    let io = async {
        let mut s = TcpStream::connect(host).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await?;
        Ok::<_, std::io::Error>(resp)
    };
    let resp = tokio::time::timeout(Duration::from_secs(2), io)
        .await
        .map_err(|_| fail(format!("{url}: timed out")))?
        .map_err(|e| Error::with_cause(Source::Internal, url.to_string(), e))?;
    let line = String::from_utf8_lossy(&resp);
    if line.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(fail(format!(
            "{url}: {}",
            line.lines().next().unwrap_or("no answer")
        )))
    }
}
