"""Measures what learning the server's plan (EXPLAIN of the client's read) would add to
a rollup read; see scripts/bench-rollup-flags.sh. Writes a markdown report."""

import argparse
import json
import statistics
import subprocess
import time

import pymysql
from pymysql.constants import CLIENT

READS = [
    # The read of docs/design.md "Column definitions", with a relative range.
    "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (1, 2) "
    "AND created_at >= NOW() - INTERVAL 7 DAY GROUP BY track_id",
    # Top tracks of the last day.
    "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (1, 2, 3, 4, 5, 6, 7, 8) "
    "AND created_at >= NOW() - INTERVAL 1 DAY GROUP BY track_id ORDER BY n DESC",
    # A day of one hot track and a cold one, literal bounds.
    "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (1, 9) "
    "AND created_at BETWEEN NOW() - INTERVAL 2 DAY AND NOW() - INTERVAL 1 DAY GROUP BY track_id",
]


def rewrite_of(args, sql):
    out = subprocess.run(
        [args.heatsink, "explain", "--rules", args.rules, "--backend-url", args.url, "--db", "logs",
         "--format", "json", sql],
        check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    doc = doc[0] if isinstance(doc, list) else doc
    assert doc["outcome"] == "rewrite", doc
    return doc["rule"], doc["statements"][0], doc["prelude"][0]


def drain(cur):
    cur.fetchall()
    while cur.nextset():
        cur.fetchall()


def timed(conn, steps, iters):
    """Latencies (µs) of running `steps` (statements, each one round trip) iters times."""
    cur = conn.cursor()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        for s in steps:
            cur.execute(s)
            drain(cur)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def main():
    ap = argparse.ArgumentParser()
    for k in ["port", "rounds", "iters", "rows", "days", "tracks"]:
        ap.add_argument(f"--{k}", type=int, required=True)
    for k in ["user", "password", "heatsink", "rules", "url", "version", "commit", "out"]:
        ap.add_argument(f"--{k}", required=True)
    args = ap.parse_args()
    conn = pymysql.connect(host="127.0.0.1", port=args.port, user=args.user,
                           password=args.password, database="logs",
                           client_flag=CLIENT.MULTI_STATEMENTS, autocommit=True)
    cur = conn.cursor()
    rows = []
    plans = []
    for sql in READS:
        rule, one_step, bounds = rewrite_of(args, sql)
        cur.execute("EXPLAIN " + sql)
        cols = [d[0] for d in cur.description]
        plan = [dict(zip(cols, r)) for r in cur.fetchall()]
        plans.append((sql, rule, plan))
        legs = {
            "rollup": [bounds, one_step],
            "explain_same": [f"{bounds}; EXPLAIN {sql}", one_step],
            "explain_more": [bounds, "EXPLAIN " + sql, one_step],
            "direct": [sql],
        }
        samples = {k: [] for k in legs}
        for _ in range(args.rounds):
            for k, steps in legs.items():
                timed(conn, steps, max(1, args.iters // 20))  # warm
                samples[k].extend(timed(conn, steps, args.iters))
        stats = {k: (statistics.median(v), statistics.fmean(v)) for k, v in samples.items()}
        rows.append((sql, stats, len(samples["rollup"])))
    load = open("/proc/loadavg").read().split()[:3]
    base = lambda s: s["rollup"]
    with open(args.out, "w") as f:
        f.write("# Rollup reads: the cost of learning the server's plan for column flags\n\n")
        f.write(f"scripts/bench-rollup-flags.sh, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                f"heatsink {args.commit}, MariaDB {args.version}, load average at the end "
                f"{' '.join(load)} (2 cores shared with other work; client, server on one machine).\n\n")
        f.write(f"Log: {args.rows:,} rows over {args.days} days, {args.tracks} tracks (track 1: a tenth "
                "of the plays), `KEY (track_id)`, `KEY (created_at)`; rollups by track_id per hour "
                "and per day (`heatsink migrate --apply`). Statements sent straight to MariaDB "
                "by one pymysql connection (text protocol): the proxy's own overhead is not in "
                f"these numbers. {args.rounds} rounds of {args.iters} runs per leg, legs "
                "interleaved; latency per read in µs.\n\n")
        f.write("- **rollup**: what heatsink runs today for the text read: the bounds query, then the "
                "rewritten read (its one-step form as `heatsink explain` prints it)\n")
        f.write("- **explain_same**: the bounds query and `EXPLAIN <the read>` in one round trip "
                "(one multi-statement COM_QUERY: the cost of pipelining them), then the rewritten read\n")
        f.write("- **explain_more**: the bounds query, `EXPLAIN <the read>` (a round trip of its own), "
                "the rewritten read\n")
        f.write("- **direct**: the read sent to the log (reference)\n\n")
        f.write("| read | rollup p50 | explain_same p50 | explain_more p50 | direct p50 | "
                "**explain_same / rollup** (p50, mean) | **explain_more / rollup** (p50, mean) | runs per leg |\n")
        f.write("|---|---:|---:|---:|---:|---:|---:|---:|\n")
        for i, (sql, s, n) in enumerate(rows, 1):
            r = base(s)
            f.write(f"| {i} | {s['rollup'][0]:,.0f} | {s['explain_same'][0]:,.0f} | "
                    f"{s['explain_more'][0]:,.0f} | {s['direct'][0]:,.0f} | "
                    f"**{s['explain_same'][0] / r[0]:.2f}**, {s['explain_same'][1] / r[1]:.2f} | "
                    f"**{s['explain_more'][0] / r[0]:.2f}**, {s['explain_more'][1] / r[1]:.2f} | {n} |\n")
        f.write("\nThroughput at 1 connection is the inverse of the mean: the ratios of the means "
                "above are the ratios of reads per second (inverted).\n\n")
        f.write("## The reads and the plans MariaDB picks for them\n\n")
        for i, (sql, rule, plan) in enumerate(plans, 1):
            f.write(f"{i}. `{sql}` (answered by `{rule}`)\n")
            for p in plan:
                f.write(f"   - EXPLAIN: key `{p.get('key')}`, rows {p.get('rows')}, "
                        f"Extra `{p.get('Extra')}`\n")
        f.write("\n")


if __name__ == "__main__":
    main()
