//! What the query digests cost per statement on the data path, single thread: the
//! work a session does for a statement's digest (fingerprint, hot key, one
//! `Digests::record`), timed over many iterations for a few realistic statements.
//!
//! ```text
//! cargo run --release --example digest_bench            # 2,000,000 iterations each
//! cargo run --release --example digest_bench -- 500000  # fewer
//! ```
//!
//! Statements: a point select as a text statement (what a COM_QUERY costs), the
//! COM_STMT_EXECUTE of a prepared point select (its digest was made at prepare time:
//! only the parameter read and the record), a SELECT with a 50-item IN list, and a
//! 100-row INSERT (about 3 KB). Each is run under one (schema, user), so the record
//! updates a row already in the table, as in steady traffic. bench/results/digest.md
//! sets the numbers against the proxy's CPU per statement.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use heatsink::digest::{execute_param, Digester, Digests, Handling, Sample, DEFAULT_DIGESTS};
use heatsink::rewrite::LexMode;

/// One text statement's digest work, as `Session::query` does it.
fn text_statement(d: &mut Digester, table: &Digests, sql: &[u8], rule: Option<&Arc<str>>) {
    let fp = d.digest(sql, Some(LexMode::default()));
    let hot = d.hot(sql);
    let hot = hot
        .as_ref()
        .and_then(|h| Some((&*h.column, &**h.literal.as_ref()?)));
    let at = Instant::now();
    table.record(
        &Sample {
            hash: fp.hash,
            schema: Some("sbtest"),
            user: "sbtest",
            took: Duration::from_micros(180),
            at,
            rows_sent: 1,
            rows_affected: 0,
            error: None,
            handling: Handling::Passthrough,
            rule,
            hot,
        },
        || d.text(sql),
    );
}

/// One prepared execute's digest work, as `Session::end_execute_digest` does it.
fn execute(
    table: &Digests,
    hash: u64,
    text: &str,
    payload: &[u8],
    types: &mut Vec<u8>,
    value: &mut Vec<u8>,
) {
    let hot = execute_param(payload, 1, types, 0, value).then_some(("id", value.as_slice()));
    let at = Instant::now();
    table.record(
        &Sample {
            hash,
            schema: Some("sbtest"),
            user: "sbtest",
            took: Duration::from_micros(180),
            at,
            rows_sent: 1,
            rows_affected: 0,
            error: None,
            handling: Handling::Passthrough,
            rule: None,
            hot,
        },
        || text.to_string(),
    );
}

/// This thread's CPU time (ns), from `/proc/thread-self/schedstat`: on a machine
/// shared with other work the wall clock counts the time the thread waited for a core.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Times `n` text statements taken round-robin from `corpus` and reports them under
/// `label` when `report_it` (the first pass only warms up).
fn time_text(
    d: &mut Digester,
    table: &Digests,
    label: &str,
    corpus: &[Vec<u8>],
    n: u64,
    report_it: bool,
) {
    let t = Clock::start();
    for i in 0..n {
        let sql = &corpus[(i % corpus.len() as u64) as usize];
        text_statement(d, table, black_box(sql), None);
    }
    if report_it {
        report(label, corpus[0].len(), n, &t);
    }
}

/// A CPU-time stopwatch.
struct Clock(u64);

impl Clock {
    fn start() -> Clock {
        Clock(cpu_ns())
    }

    fn ns(&self) -> u64 {
        cpu_ns().saturating_sub(self.0)
    }
}

fn report(name: &str, bytes: usize, n: u64, took: &Clock) {
    let ns = took.ns() as f64 / n as f64;
    println!("| {name} | {bytes} | {n} | {ns:.0} |");
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let table = Digests::new(DEFAULT_DIGESTS);
    let mut d = Digester::default();

    // Keys vary per iteration as in traffic (the hot-key sketch sees new values).
    let point: Vec<Vec<u8>> = (0..1024)
        .map(|i| {
            format!(
                "SELECT c FROM sbtest{} WHERE id={}",
                1 + i % 4,
                1 + (i * 7919) % 10000
            )
            .into_bytes()
        })
        .collect();
    let in_list: Vec<Vec<u8>> = (0..64)
        .map(|i| {
            let ids: Vec<String> = (0..50)
                .map(|k| (1 + (i * 50 + k) * 37 % 10000).to_string())
                .collect();
            format!(
                "SELECT id, k, c, pad FROM sbtest1 WHERE id IN ({}) AND k > 0",
                ids.join(", ")
            )
            .into_bytes()
        })
        .collect();
    let insert: Vec<Vec<u8>> = (0..16)
        .map(|i| {
            let rows: Vec<String> = (0..100)
                .map(|k| format!("({}, {}, 'row-{i}-{k}', 'pad-{k}')", i * 100 + k, k * 3))
                .collect();
            format!(
                "INSERT INTO sbtest2 (id, k, c, pad) VALUES {}",
                rows.join(", ")
            )
            .into_bytes()
        })
        .collect();
    // COM_STMT_EXECUTE of `SELECT c FROM sbtest1 WHERE id=?`: command, statement id,
    // flags, iteration count, NULL bitmap, new-params-bound, types (LONG), value.
    let executes: Vec<Vec<u8>> = (0..1024u32)
        .map(|i| {
            let mut p = vec![0x17, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 0];
            p.extend_from_slice(&(1 + (i * 7919) % 10000).to_le_bytes());
            p
        })
        .collect();
    let prepared = b"SELECT c FROM sbtest1 WHERE id=?";
    let prep_fp = d.digest(prepared, Some(LexMode::default()));
    let prep_text = d.text(prepared);

    println!("| statement | bytes | iterations | CPU ns per statement |");
    println!("|---|---:|---:|---:|");
    for _ in 0..2 {
        // The first pass warms up; the second is reported.
        let report_it = !table.is_empty();
        time_text(
            &mut d,
            &table,
            "point select, text (COM_QUERY)",
            &point,
            n,
            report_it,
        );
        let (mut types, mut value) = (Vec::new(), Vec::new());
        let t = Clock::start();
        for i in 0..n {
            let p = &executes[(i % 1024) as usize];
            execute(
                &table,
                prep_fp.hash,
                &prep_text,
                black_box(p),
                &mut types,
                &mut value,
            );
        }
        if report_it {
            report(
                "point select, prepared (COM_STMT_EXECUTE)",
                executes[0].len(),
                n,
                &t,
            );
        }
        let label = "SELECT with a 50-item IN list, text";
        time_text(&mut d, &table, label, &in_list, (n / 10).max(1), report_it);
        let label = "100-row INSERT, text";
        time_text(&mut d, &table, label, &insert, (n / 100).max(1), report_it);
        // Fingerprint alone (no record), for the split.
        let t = Clock::start();
        for i in 0..n {
            let sql = &point[(i % 1024) as usize];
            black_box(d.digest(black_box(sql), Some(LexMode::default())));
        }
        if report_it {
            report("point select, fingerprint only", point[0].len(), n, &t);
        }
    }
    eprintln!("rows held: {}", table.len());
}
