//! A small MySQL load generator for benchmarking heatsink against a direct
//! backend connection.
//!
//! Each of `--connections` tasks owns one connection and runs statements back to
//! back (closed loop). Latency is recorded per statement, including reading the
//! whole result, into a log-linear histogram (< 1 % relative error).
//!
//! ```text
//! cargo run --release --example loadgen -- \
//!     --url mysql://sb:sb-pw@127.0.0.1:6033/sbtest --connections 16 --duration 10 \
//!     --prepared --sql 'SELECT c FROM sbtest1 WHERE id={rand:1:10000}'
//! ```
//!
//! Placeholders in statements:
//! - `{rand:LO:HI}`: uniform integer in `LO..=HI`;
//! - `{seq}`: a process-wide increasing counter (one value per execution, shared by
//!   every `{seq}` of that statement);
//! - `{conn}`: the connection index (0-based);
//! - `{randstr:N}`: `N` random alphanumeric characters.
//!
//! With `--prepared` every placeholder becomes a `?` parameter bound per execution
//! (binary protocol, COM_STMT_EXECUTE). A placeholder written inside quotes, as in
//! `'{randstr:8}'`, loses its quotes there, so one statement text works for both
//! protocols. Without `--prepared` the values are inlined into the text (text
//! protocol, COM_QUERY).
//!
//! `--setup SQL` (repeatable) runs statements once on every connection right after it
//! is established (and again after a reconnect), before it runs the measured
//! statements: a session that changed its state first, e.g. `SET time_zone = '+00:00'`
//! or `CREATE TEMPORARY TABLE …`. Setup statements are sent as they are (text
//! protocol, no placeholders) and are not measured.
//!
//! Errors are counted and do not stop the run; a connection whose error is fatal
//! is re-established. The run stops by itself at `--duration` (or after
//! `--requests`), with a hard stop a few seconds later for statements that hang.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Params, Statement, Value};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// How many distinct error messages are kept for the report.
const MAX_ERROR_SAMPLES: usize = 5;
/// Grace period after the deadline before in-flight statements are abandoned.
const HARD_STOP_GRACE: Duration = Duration::from_secs(5);
/// Pause before re-establishing a broken connection, so a dead backend is not spun on.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);

#[derive(Parser, Debug)]
#[command(about = "MySQL load generator (closed loop, one task per connection)")]
struct Args {
    /// Connection URL, e.g. mysql://user:pw@127.0.0.1:3306/db
    #[arg(long)]
    url: String,
    /// Number of concurrent connections.
    #[arg(long, short = 'c', default_value_t = 1)]
    connections: usize,
    /// Measured run time in seconds (after the warmup).
    #[arg(long, short = 'd')]
    duration: Option<f64>,
    /// Total number of measured statements across all connections (instead of, or as
    /// well as, --duration; whichever comes first ends the run).
    #[arg(long)]
    requests: Option<u64>,
    /// Warmup in seconds: statements run but are not recorded.
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// One statement to run (may contain placeholders).
    #[arg(long, conflicts_with = "sql_file")]
    sql: Option<String>,
    /// File of statements, one per line (blank lines and lines starting with `#` or
    /// `--` are skipped, a trailing `;` is removed).
    #[arg(long)]
    sql_file: Option<String>,
    /// How each connection picks the next statement from --sql-file.
    #[arg(long, value_enum, default_value_t = Mix::RoundRobin)]
    mix: Mix,
    /// Use server-side prepared statements (binary protocol) instead of COM_QUERY.
    #[arg(long)]
    prepared: bool,
    /// Print one line of JSON instead of a human-readable line.
    #[arg(long)]
    json: bool,
    /// Free-form label copied into the report (useful in scripts).
    #[arg(long, default_value = "")]
    label: String,
    /// Tokio worker threads (default: min(available cores, connections)).
    #[arg(long)]
    threads: Option<usize>,
    /// RNG seed (default: random). Connection i uses seed + i.
    #[arg(long)]
    seed: Option<u64>,
    /// First value of {seq}.
    #[arg(long, default_value_t = 1)]
    seq_start: u64,
    /// A statement run once on every new connection before its measured statements
    /// (repeatable, run in order; text protocol, no placeholders, not measured).
    #[arg(long)]
    setup: Vec<String>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Mix {
    RoundRobin,
    Random,
}

// ---------------------------------------------------------------------------
// Statement templates
// ---------------------------------------------------------------------------

/// One piece of a statement template.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    /// Literal SQL text, copied as is.
    Text(String),
    /// `{rand:LO:HI}`.
    Rand(i64, i64),
    /// `{seq}`.
    Seq,
    /// `{conn}`.
    Conn,
    /// `{randstr:N}`; the flag records that the placeholder sat between single quotes
    /// which were removed from the surrounding text (re-added in text mode).
    RandStr(usize, bool),
}

/// A parsed statement: the text for COM_QUERY is rendered from the segments; the
/// text for COM_STMT_PREPARE has a `?` in place of each placeholder.
#[derive(Clone, Debug)]
struct Template {
    segments: Vec<Segment>,
    /// The statement with `?` for each placeholder (used with --prepared).
    prepared_sql: String,
    /// Whether the statement has a `{seq}` (so the counter is only touched if needed).
    uses_seq: bool,
}

fn parse_placeholder(body: &str) -> Result<Segment, String> {
    let parts: Vec<&str> = body.split(':').collect();
    match parts.as_slice() {
        ["seq"] => Ok(Segment::Seq),
        ["conn"] => Ok(Segment::Conn),
        ["rand", lo, hi] => {
            let lo: i64 = lo
                .trim()
                .parse()
                .map_err(|e| format!("{{{body}}}: bad LO: {e}"))?;
            let hi: i64 = hi
                .trim()
                .parse()
                .map_err(|e| format!("{{{body}}}: bad HI: {e}"))?;
            if lo > hi {
                return Err(format!("{{{body}}}: LO > HI"));
            }
            Ok(Segment::Rand(lo, hi))
        }
        ["randstr", n] => {
            let n: usize = n
                .trim()
                .parse()
                .map_err(|e| format!("{{{body}}}: bad N: {e}"))?;
            Ok(Segment::RandStr(n, false))
        }
        _ => Err(format!("unknown placeholder {{{body}}}")),
    }
}

impl Template {
    /// Parses `sql`. Anything in braces that is not a known placeholder is an
    /// error (so a typo does not silently become literal SQL).
    fn parse(sql: &str) -> Result<Template, String> {
        let mut segments: Vec<Segment> = Vec::new();
        let mut text = String::new();
        let mut rest = sql;
        while let Some(open) = rest.find('{') {
            let Some(close_rel) = rest[open..].find('}') else {
                break;
            };
            let body = &rest[open + 1..open + close_rel];
            let mut seg = parse_placeholder(body)?;
            text.push_str(&rest[..open]);
            let after = &rest[open + close_rel + 1..];
            // A placeholder written as '{...}': drop the quotes around it so that the
            // prepared form is a bare `?`; text mode re-adds them for strings.
            let quoted = text.ends_with('\'') && after.starts_with('\'');
            let after = if quoted {
                text.pop();
                &after[1..]
            } else {
                after
            };
            if !text.is_empty() {
                segments.push(Segment::Text(std::mem::take(&mut text)));
            }
            if let Segment::RandStr(n, _) = seg {
                seg = Segment::RandStr(n, quoted);
            } else if quoted {
                // Numbers inside quotes: keep the quotes in text mode as well.
                segments.push(Segment::Text("'".into()));
                segments.push(seg);
                segments.push(Segment::Text("'".into()));
                rest = after;
                continue;
            }
            segments.push(seg);
            rest = after;
        }
        text.push_str(rest);
        if !text.is_empty() {
            segments.push(Segment::Text(text));
        }

        // Prepared form: text segments verbatim, placeholders as `?`. The quote
        // segments emitted for quoted numbers are dropped there.
        let mut prepared_sql = String::new();
        let mut i = 0;
        while i < segments.len() {
            match &segments[i] {
                Segment::Text(t)
                    if t == "'"
                        && matches!(
                            segments.get(i + 1),
                            Some(Segment::Rand(..) | Segment::Seq | Segment::Conn)
                        )
                        && matches!(segments.get(i + 2), Some(Segment::Text(q)) if q == "'") =>
                {
                    prepared_sql.push('?');
                    i += 3;
                    continue;
                }
                Segment::Text(t) => prepared_sql.push_str(t),
                _ => prepared_sql.push('?'),
            }
            i += 1;
        }
        let uses_seq = segments.contains(&Segment::Seq);
        Ok(Template {
            segments,
            prepared_sql,
            uses_seq,
        })
    }

    /// Renders the statement for COM_QUERY.
    fn render_text(&self, out: &mut String, ctx: &mut ExecCtx<'_>) {
        out.clear();
        let seq = self.next_seq(ctx);
        for seg in &self.segments {
            match seg {
                Segment::Text(t) => out.push_str(t),
                Segment::Rand(lo, hi) => {
                    let v = ctx.rng.random_range(*lo..=*hi);
                    let _ = write!(out, "{v}");
                }
                Segment::Seq => {
                    let _ = write!(out, "{seq}");
                }
                Segment::Conn => {
                    let _ = write!(out, "{}", ctx.conn_index);
                }
                Segment::RandStr(n, quoted) => {
                    if *quoted {
                        out.push('\'');
                    }
                    push_randstr(out, *n, ctx.rng);
                    if *quoted {
                        out.push('\'');
                    }
                }
            }
        }
    }

    /// Builds the parameters for COM_STMT_EXECUTE.
    fn render_params(&self, ctx: &mut ExecCtx<'_>) -> Params {
        let seq = self.next_seq(ctx);
        let mut values = Vec::new();
        for seg in &self.segments {
            match seg {
                Segment::Text(_) => {}
                Segment::Rand(lo, hi) => values.push(Value::Int(ctx.rng.random_range(*lo..=*hi))),
                Segment::Seq => values.push(Value::UInt(seq)),
                Segment::Conn => values.push(Value::UInt(ctx.conn_index as u64)),
                Segment::RandStr(n, _) => {
                    let mut s = String::with_capacity(*n);
                    push_randstr(&mut s, *n, ctx.rng);
                    values.push(Value::Bytes(s.into_bytes()));
                }
            }
        }
        if values.is_empty() {
            Params::Empty
        } else {
            Params::Positional(values)
        }
    }

    fn next_seq(&self, ctx: &ExecCtx<'_>) -> u64 {
        if self.uses_seq {
            ctx.seq.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        }
    }
}

fn push_randstr(out: &mut String, n: usize, rng: &mut SmallRng) {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for _ in 0..n {
        out.push(ALPHABET[rng.random_range(0..ALPHABET.len())] as char);
    }
}

/// Per-execution context handed to the template renderer.
struct ExecCtx<'a> {
    rng: &'a mut SmallRng,
    seq: &'a AtomicU64,
    conn_index: usize,
}

fn load_statements(args: &Args) -> Result<Vec<Template>, String> {
    let raw: Vec<String> = match (&args.sql, &args.sql_file) {
        (Some(sql), None) => vec![sql.clone()],
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("--"))
                .map(|l| l.trim_end_matches(';').trim_end().to_string())
                .collect()
        }
        _ => return Err("give exactly one of --sql or --sql-file".into()),
    };
    if raw.is_empty() {
        return Err("no statements to run".into());
    }
    raw.iter()
        .map(|s| Template::parse(s).map_err(|e| format!("{e} in: {s}")))
        .collect()
}

// ---------------------------------------------------------------------------
// Histogram
// ---------------------------------------------------------------------------

/// Sub-bucket bits: each power of two is split into 2^(SUB_BITS-1) linear buckets,
/// so the relative error of a bucket is below 2^-(SUB_BITS-1) (< 1.6 % for 7).
const SUB_BITS: u32 = 7;
const HALF: u64 = 1 << (SUB_BITS - 1);
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 2) * HALF as usize;

/// A log-linear histogram of nanosecond values (in the spirit of HdrHistogram).
#[derive(Clone)]
struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Histogram {
    fn new() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < (1 << SUB_BITS) {
            return v as usize;
        }
        let msb = 63 - v.leading_zeros();
        let shift = msb + 1 - SUB_BITS;
        let top = v >> shift; // in [HALF, 2*HALF)
        (shift as u64 * HALF + top) as usize
    }

    /// Lowest and highest value that fall into bucket `idx`.
    fn bounds(idx: usize) -> (u64, u64) {
        let idx = idx as u64;
        if idx < (1 << SUB_BITS) {
            return (idx, idx);
        }
        let shift = idx / HALF - 1;
        let top = idx - shift * HALF;
        let lo = top << shift;
        (lo, lo + (1u64 << shift) - 1)
    }

    fn record(&mut self, v: u64) {
        self.counts[Self::index(v)] += 1;
        self.total += 1;
        self.sum += v as u128;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// The value at quantile `q` (0..=1): the midpoint of the bucket holding it,
    /// clamped to the recorded min/max.
    fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (idx, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = Self::bounds(idx);
                return (lo + (hi - lo) / 2).clamp(self.min, self.max);
            }
        }
        self.max
    }

    fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }
}

// ---------------------------------------------------------------------------
// Run
// ---------------------------------------------------------------------------

/// State shared by all connection tasks.
struct Shared {
    templates: Vec<Template>,
    /// --setup statements, run on every new connection.
    setup: Vec<String>,
    opts: Opts,
    prepared: bool,
    mix: Mix,
    /// The `{seq}` counter.
    seq: AtomicU64,
    /// Measured statements claimed so far (only used with --requests).
    claimed: AtomicU64,
    /// Total measured statements wanted (--requests).
    requests: Option<u64>,
    /// Set once the run is over (deadline or request budget reached).
    stop: AtomicBool,
    errors: AtomicU64,
    error_samples: Mutex<Vec<String>>,
}

impl Shared {
    fn note_error(&self, msg: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut samples) = self.error_samples.lock() {
            if samples.len() < MAX_ERROR_SAMPLES && !samples.contains(&msg) {
                samples.push(msg);
            }
        }
    }
}

/// The time window of the run.
#[derive(Clone, Copy)]
struct Window {
    /// Statements completed before this instant are not recorded.
    measure_from: Instant,
    /// No statement starts after this instant.
    end: Option<Instant>,
    /// In-flight statements are abandoned at this instant.
    hard_stop: Option<Instant>,
}

/// What one connection task reports back.
struct TaskResult {
    hist: Histogram,
    /// When this task finished its last measured statement.
    last_done: Option<Instant>,
}

/// One connection with its prepared statements (prepared lazily, reset on reconnect).
struct Session {
    conn: Conn,
    stmts: Vec<Option<Statement>>,
}

/// Runs the --setup statements on a new connection.
async fn run_setup(conn: &mut Conn, setup: &[String]) -> Result<(), mysql_async::Error> {
    for sql in setup {
        conn.query_drop(sql.as_str()).await?;
    }
    Ok(())
}

/// Connects and runs the --setup statements.
async fn connect(opts: Opts, setup: &[String]) -> Result<Conn, mysql_async::Error> {
    let mut conn = Conn::new(opts).await?;
    run_setup(&mut conn, setup).await?;
    Ok(conn)
}

async fn with_hard_stop<T>(
    hard_stop: Option<Instant>,
    fut: impl std::future::Future<Output = Result<T, mysql_async::Error>>,
) -> Result<Result<T, mysql_async::Error>, ()> {
    match hard_stop {
        Some(at) => tokio::time::timeout_at(at, fut).await.map_err(|_| ()),
        None => Ok(fut.await),
    }
}

async fn run_connection(
    shared: Arc<Shared>,
    conn_index: usize,
    mut session: Option<Session>,
    mut rng: SmallRng,
    window: Window,
) -> TaskResult {
    let mut hist = Histogram::new();
    let mut last_done = None;
    let mut text = String::new();
    let mut rr = conn_index;
    let n = shared.templates.len();

    loop {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let now = Instant::now();
        if window.end.is_some_and(|end| now >= end) {
            break;
        }
        let measured = now >= window.measure_from;
        if measured {
            if let Some(limit) = shared.requests {
                if shared.claimed.fetch_add(1, Ordering::Relaxed) >= limit {
                    shared.stop.store(true, Ordering::Relaxed);
                    break;
                }
            }
        }

        // (Re)connect if needed.
        let sess = match session.as_mut() {
            Some(s) => s,
            None => match with_hard_stop(
                window.hard_stop,
                connect(shared.opts.clone(), &shared.setup),
            )
            .await
            {
                Ok(Ok(conn)) => session.insert(Session {
                    conn,
                    stmts: vec![None; n],
                }),
                Ok(Err(e)) => {
                    shared.note_error(format!("connect: {e}"));
                    tokio::time::sleep(RECONNECT_BACKOFF).await;
                    continue;
                }
                Err(()) => break,
            },
        };

        let which = match shared.mix {
            Mix::RoundRobin => {
                rr = rr.wrapping_add(1);
                rr % n
            }
            Mix::Random => rng.random_range(0..n),
        };
        let template = &shared.templates[which];
        let mut ctx = ExecCtx {
            rng: &mut rng,
            seq: &shared.seq,
            conn_index,
        };

        let (started, outcome) = if shared.prepared {
            let params = template.render_params(&mut ctx);
            let stmt = match &sess.stmts[which] {
                Some(s) => s.clone(),
                None => match with_hard_stop(
                    window.hard_stop,
                    sess.conn.prep(template.prepared_sql.as_str()),
                )
                .await
                {
                    Ok(Ok(s)) => {
                        sess.stmts[which] = Some(s.clone());
                        s
                    }
                    Ok(Err(e)) => {
                        let fatal = e.is_fatal();
                        shared.note_error(format!("prepare: {e}"));
                        if fatal {
                            session = None;
                            tokio::time::sleep(RECONNECT_BACKOFF).await;
                        }
                        continue;
                    }
                    Err(()) => break,
                },
            };
            let started = Instant::now();
            (
                started,
                with_hard_stop(window.hard_stop, sess.conn.exec_drop(&stmt, params)).await,
            )
        } else {
            template.render_text(&mut text, &mut ctx);
            let started = Instant::now();
            (
                started,
                with_hard_stop(window.hard_stop, sess.conn.query_drop(text.as_str())).await,
            )
        };
        let done = Instant::now();

        match outcome {
            Ok(Ok(())) => {
                if started >= window.measure_from {
                    hist.record(done.duration_since(started).as_nanos() as u64);
                    last_done = Some(done);
                }
            }
            Ok(Err(e)) => {
                let fatal = e.is_fatal();
                shared.note_error(e.to_string());
                if fatal {
                    session = None;
                    tokio::time::sleep(RECONNECT_BACKOFF).await;
                }
            }
            Err(()) => {
                shared.note_error("statement still running at the hard stop".into());
                session = None;
                break;
            }
        }
    }

    if let Some(s) = session {
        let _ = tokio::time::timeout(Duration::from_secs(1), s.conn.disconnect()).await;
    }
    TaskResult { hist, last_done }
}

/// The final numbers.
struct Report {
    label: String,
    connections: usize,
    prepared: bool,
    seconds: f64,
    hist: Histogram,
    errors: u64,
    error_samples: Vec<String>,
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Report {
    fn ops_per_sec(&self) -> f64 {
        if self.seconds > 0.0 {
            self.hist.total as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn us(ns: u64) -> f64 {
        ns as f64 / 1000.0
    }

    fn json(&self) -> String {
        let h = &self.hist;
        let samples: Vec<String> = self.error_samples.iter().map(|s| json_escape(s)).collect();
        format!(
            "{{\"label\":{},\"connections\":{},\"prepared\":{},\"seconds\":{:.3},\"ops\":{},\
             \"ops_per_sec\":{:.1},\"errors\":{},\"min_us\":{:.1},\"mean_us\":{:.1},\
             \"p50_us\":{:.1},\"p95_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1},\
             \"max_us\":{:.1},\"error_samples\":[{}]}}",
            json_escape(&self.label),
            self.connections,
            self.prepared,
            self.seconds,
            h.total,
            self.ops_per_sec(),
            self.errors,
            Self::us(if h.total == 0 { 0 } else { h.min }),
            h.mean() / 1000.0,
            Self::us(h.quantile(0.50)),
            Self::us(h.quantile(0.95)),
            Self::us(h.quantile(0.99)),
            Self::us(h.quantile(0.999)),
            Self::us(h.max),
            samples.join(","),
        )
    }

    fn human(&self) -> String {
        let h = &self.hist;
        let mut s = String::new();
        if !self.label.is_empty() {
            let _ = write!(s, "[{}] ", self.label);
        }
        let _ = write!(
            s,
            "{} conn{} {}: {} ops in {:.2}s = {:.0} ops/s; latency us p50 {:.1} p95 {:.1} \
             p99 {:.1} max {:.1} (mean {:.1}); errors {}",
            self.connections,
            if self.connections == 1 { "" } else { "s" },
            if self.prepared { "prepared" } else { "text" },
            h.total,
            self.seconds,
            self.ops_per_sec(),
            Self::us(h.quantile(0.50)),
            Self::us(h.quantile(0.95)),
            Self::us(h.quantile(0.99)),
            Self::us(h.max),
            h.mean() / 1000.0,
            self.errors,
        );
        for e in &self.error_samples {
            let _ = write!(s, "\n  error: {e}");
        }
        s
    }
}

async fn run(args: Args) -> Result<Report, String> {
    let templates = load_statements(&args)?;
    if args.connections == 0 {
        return Err("--connections must be at least 1".into());
    }
    if args.duration.is_none() && args.requests.is_none() {
        return Err("give --duration and/or --requests".into());
    }
    let bad =
        |v: f64, min_exclusive: bool| !v.is_finite() || v < 0.0 || (min_exclusive && v == 0.0);
    if args.duration.is_some_and(|d| bad(d, true)) || bad(args.warmup, false) {
        return Err("--duration must be > 0 and --warmup >= 0".into());
    }
    let base = Opts::from_url(&args.url).map_err(|e| format!("--url: {e}"))?;
    let opts: Opts = OptsBuilder::from_opts(base)
        .prefer_socket(false)
        .stmt_cache_size(templates.len() + 8)
        .into();

    // Connect everything before the clock starts; a backend that refuses the first
    // connections is a setup error, not a measurement.
    let mut connects = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let opts = opts.clone();
        let setup = args.setup.clone();
        connects.push(tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(10), connect(opts, &setup)).await
        }));
    }
    let mut conns = Vec::with_capacity(args.connections);
    for h in connects {
        match h.await {
            Ok(Ok(Ok(c))) => conns.push(c),
            Ok(Ok(Err(e))) => return Err(format!("connect: {e}")),
            Ok(Err(_)) => return Err("connect: timed out after 10s".into()),
            Err(e) => return Err(format!("connect task: {e}")),
        }
    }

    let shared = Arc::new(Shared {
        templates,
        setup: args.setup.clone(),
        opts,
        prepared: args.prepared,
        mix: args.mix,
        seq: AtomicU64::new(args.seq_start),
        claimed: AtomicU64::new(0),
        requests: args.requests,
        stop: AtomicBool::new(false),
        errors: AtomicU64::new(0),
        error_samples: Mutex::new(Vec::new()),
    });

    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let end = args
        .duration
        .map(|d| measure_from + Duration::from_secs_f64(d));
    let window = Window {
        measure_from,
        end,
        hard_stop: end.map(|e| e + HARD_STOP_GRACE),
    };
    let seed = args.seed.unwrap_or_else(rand::random);

    let mut tasks = Vec::with_capacity(conns.len());
    for (i, conn) in conns.into_iter().enumerate() {
        let session = Session {
            conn,
            stmts: vec![None; shared.templates.len()],
        };
        let rng = SmallRng::seed_from_u64(seed.wrapping_add(i as u64));
        tasks.push(tokio::spawn(run_connection(
            shared.clone(),
            i,
            Some(session),
            rng,
            window,
        )));
    }

    let mut hist = Histogram::new();
    let mut last_done: Option<Instant> = None;
    for t in tasks {
        match t.await {
            Ok(r) => {
                hist.merge(&r.hist);
                last_done = last_done.max(r.last_done);
            }
            Err(e) => shared.note_error(format!("connection task failed: {e}")),
        }
    }

    // Measured time: the window for --duration runs, otherwise until the last
    // measured statement finished.
    let until = match end {
        Some(end) if !shared.stop.load(Ordering::Relaxed) => end,
        _ => last_done.unwrap_or(measure_from),
    };
    let seconds = until.saturating_duration_since(measure_from).as_secs_f64();
    let error_samples = shared
        .error_samples
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    Ok(Report {
        label: args.label,
        connections: args.connections,
        prepared: args.prepared,
        seconds,
        hist,
        errors: shared.errors.load(Ordering::Relaxed),
        error_samples,
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(args.connections.max(1))
    });
    let rt = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadgen: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = args.json;
    match rt.block_on(run(args)) {
        Ok(report) => {
            if json {
                println!("{}", report.json());
            } else {
                println!("{}", report.human());
            }
            // Do not wait for stray tasks (e.g. a hung disconnect).
            rt.shutdown_timeout(Duration::from_secs(1));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            rt.shutdown_timeout(Duration::from_secs(1));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_contiguous() {
        let mut prev_hi = None;
        for idx in 0..BUCKETS - HALF as usize {
            let (lo, hi) = Histogram::bounds(idx);
            if let Some(p) = prev_hi {
                assert_eq!(lo, p + 1, "bucket {idx}");
            }
            assert_eq!(Histogram::index(lo), idx);
            assert_eq!(Histogram::index(hi), idx);
            prev_hi = Some(hi);
        }
        assert!(Histogram::index(u64::MAX) < BUCKETS);
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 / 50_000_000.0 - 1.0).abs() < 0.02, "{p50}");
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 / 99_000_000.0 - 1.0).abs() < 0.02, "{p99}");
        assert_eq!(h.quantile(1.0), 100_000_000);
    }

    #[test]
    fn template_forms() {
        let t = Template::parse("SELECT c FROM t WHERE id={rand:1:10} AND k='{randstr:4}'")
            .expect("parses");
        assert_eq!(t.prepared_sql, "SELECT c FROM t WHERE id=? AND k=?");
        let mut rng = SmallRng::seed_from_u64(1);
        let seq = AtomicU64::new(7);
        let mut ctx = ExecCtx {
            rng: &mut rng,
            seq: &seq,
            conn_index: 3,
        };
        let mut s = String::new();
        t.render_text(&mut s, &mut ctx);
        assert!(s.starts_with("SELECT c FROM t WHERE id="), "{s}");
        assert!(s.ends_with('\'') && s.contains("AND k='"), "{s}");

        let t = Template::parse("INSERT INTO l VALUES ({seq}, '{conn}', {seq})").expect("parses");
        assert_eq!(t.prepared_sql, "INSERT INTO l VALUES (?, ?, ?)");
        t.render_text(&mut s, &mut ctx);
        assert_eq!(s, "INSERT INTO l VALUES (7, '3', 7)");
        match t.render_params(&mut ctx) {
            Params::Positional(v) => {
                assert_eq!(v, vec![Value::UInt(8), Value::UInt(3), Value::UInt(8)])
            }
            other => panic!("{other:?}"),
        }
        assert!(Template::parse("SELECT {nope}").is_err());
        assert!(Template::parse("SELECT {rand:5:1}").is_err());
    }
}
