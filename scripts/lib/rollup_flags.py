"""Measures what learning the server's plan (EXPLAIN of the client's read) costs a
rollup read through heatsink (`exact_flags`), against the same read with the predicted
flags and the read sent to the log; see scripts/bench-rollup-flags.sh. Writes a
markdown report."""

import argparse
import statistics
import struct
import time

import pymysql
from pymysql.constants import COMMAND
from pymysql.protocol import FieldDescriptorPacket

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


def fields(conn):
    """(name, flags) of the last result's columns."""
    return [(f.name, f.flags) for f in conn._result.fields]


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


class Prepared:
    """A statement prepared on a pymysql connection and executed in the binary
    protocol without parameters (pymysql has no prepared statements of its own)."""

    def __init__(self, conn, sql):
        self.conn = conn
        conn._execute_command(COMMAND.COM_STMT_PREPARE, sql)
        ok = conn._read_packet()
        data = ok.get_all_data()
        assert data[0] == 0, data
        self.id, ncol, npar = struct.unpack("<IHH", data[1:9])
        assert npar == 0, sql
        self.defs = [conn._read_packet(FieldDescriptorPacket) for _ in range(ncol)]
        if ncol:
            conn._read_packet()  # EOF

    def execute(self):
        """Runs the statement; returns the columns' (name, flags)."""
        self.conn._execute_command(COMMAND.COM_STMT_EXECUTE, struct.pack("<IBI", self.id, 0, 1))
        first = self.conn._read_packet()
        n = first.read_length_encoded_integer()
        defs = [self.conn._read_packet(FieldDescriptorPacket) for _ in range(n)]
        self.conn._read_packet()  # EOF
        while not self.conn._read_packet().is_eof_packet():
            pass
        return [(d.name, d.flags) for d in defs]


def timed_exec(stmt, iters):
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        stmt.execute()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def connect(port, args):
    return pymysql.connect(host="127.0.0.1", port=port, user=args.user, password=args.password,
                           database="logs", autocommit=True)


def main():
    ap = argparse.ArgumentParser()
    for k in ["port", "exact_port", "predicted_port", "rounds", "iters", "rows", "days", "tracks"]:
        ap.add_argument(f"--{k.replace('_', '-')}", dest=k, type=int, required=True)
    for k in ["user", "password", "version", "commit", "out"]:
        ap.add_argument(f"--{k}", required=True)
    args = ap.parse_args()
    conns = {
        "exact": connect(args.exact_port, args),
        "predicted": connect(args.predicted_port, args),
        "direct": connect(args.port, args),
    }
    cur = conns["direct"].cursor()
    rows = []
    plans = []
    for sql in READS:
        cur.execute("EXPLAIN " + sql)
        cols = [d[0] for d in cur.description]
        plans.append((sql, [dict(zip(cols, r)) for r in cur.fetchall()]))
        # The column flags each side gives, text and prepared.
        seen = {}
        stmts = {}
        for k, c in conns.items():
            c.cursor().execute(sql)
            seen[k] = fields(c)
            stmts[k] = Prepared(c, sql)
            seen[k + "_ps"] = stmts[k].execute()
        legs = {k: (lambda c=c: timed(c, [sql], args.iters)) for k, c in conns.items()}
        legs.update({k + "_ps": (lambda s=s: timed_exec(s, args.iters)) for k, s in stmts.items()})
        # What asking the plan costs on the server alone, in each format.
        legs["explain"] = lambda: timed(conns["direct"], ["EXPLAIN " + sql], args.iters)
        legs["explain_json"] = lambda: timed(conns["direct"], ["EXPLAIN FORMAT=JSON " + sql], args.iters)
        samples = {k: [] for k in legs}
        for _ in range(args.rounds):
            for k, leg in legs.items():
                samples[k].extend(leg())
        stats = {k: (statistics.median(v), statistics.fmean(v)) for k, v in samples.items()}
        rows.append((sql, stats, len(samples["direct"]), seen))
    load = open("/proc/loadavg").read().split()[:3]
    yes = lambda a, b: "same" if a == b else "differ"
    with open(args.out, "w") as f:
        f.write("# Rollup reads: the cost of the server's plan for column flags (`exact_flags`)\n\n")
        f.write(f"scripts/bench-rollup-flags.sh, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                f"heatsink {args.commit} (debug build), MariaDB {args.version}, load average at the end "
                f"{' '.join(load)} (2 cores shared with other work; client, proxies, server on one machine).\n\n")
        f.write(f"Log: {args.rows:,} rows over {args.days} days, {args.tracks} tracks (track 1: a tenth "
                "of the plays), `KEY (track_id)`, `KEY (created_at)`; rollups by track_id per hour "
                "and per day (`heatsink migrate --apply`). One pymysql connection per leg, "
                f"{args.rounds} rounds of {args.iters} reads per leg, legs interleaved; latency per "
                "read in µs as the client sees it.\n\n")
        f.write("- **exact**: through heatsink with `exact_flags` (the default): `EXPLAIN FORMAT=JSON` of "
                "the read pipelined with the bounds query, then the rewritten read\n")
        f.write("- **predicted**: through a second heatsink whose rules say `exact_flags = false`: the "
                "bounds query, then the rewritten read\n")
        f.write("- **direct**: the read sent to MariaDB (the log)\n")
        f.write("- **_ps**: the same read prepared once and executed (binary protocol); through heatsink "
                "with exact flags the `EXPLAIN` of the client's statement is executed in the same round "
                "trip as the rewrite\n")
        f.write("- **explain**, **explain_json**: `EXPLAIN` and `EXPLAIN FORMAT=JSON` of the read alone, "
                "sent to MariaDB (what the plan costs the server in each format)\n\n")
        f.write("| read | exact p50 | predicted p50 | direct p50 | **exact / predicted** (p50, mean) | "
                "direct / exact (p50) | exact_ps p50 | predicted_ps p50 | direct_ps p50 | "
                "**exact_ps / predicted_ps** (p50, mean) | explain p50 | explain_json p50 | runs per leg |\n")
        f.write("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
        for i, (sql, s, n, seen) in enumerate(rows, 1):
            p = lambda k: s[k][0]
            f.write(f"| {i} | {p('exact'):,.0f} | {p('predicted'):,.0f} | {p('direct'):,.0f} | "
                    f"**{p('exact') / p('predicted'):.2f}**, {s['exact'][1] / s['predicted'][1]:.2f} | "
                    f"{p('direct') / p('exact'):.1f} | {p('exact_ps'):,.0f} | {p('predicted_ps'):,.0f} | "
                    f"{p('direct_ps'):,.0f} | **{p('exact_ps') / p('predicted_ps'):.2f}**, "
                    f"{s['exact_ps'][1] / s['predicted_ps'][1]:.2f} | {p('explain'):,.0f} | "
                    f"{p('explain_json'):,.0f} | {n} |\n")
        f.write("\nThroughput at 1 connection is the inverse of the mean: the ratios of the means "
                "above are the ratios of reads per second (inverted).\n\n")
        f.write("## The reads, the plans MariaDB picks for them, and the flags each side gives\n\n")
        for i, ((sql, plan), (_, _, _, seen)) in enumerate(zip(plans, rows), 1):
            f.write(f"{i}. `{sql}`\n")
            for q in plan:
                f.write(f"   - EXPLAIN: key `{q.get('key')}`, rows {q.get('rows')}, "
                        f"Extra `{q.get('Extra')}`\n")
            f.write(f"   - column flags directly: text {seen['direct']}, prepared {seen['direct_ps']}\n")
            for k in ["exact", "predicted"]:
                f.write(f"   - {k}: text {yes(seen[k], seen['direct'])}, prepared "
                        f"{yes(seen[k + '_ps'], seen['direct_ps'])}"
                        + ("" if seen[k] == seen["direct"] else f" (text {seen[k]})") + "\n")
        f.write("\n")


if __name__ == "__main__":
    main()
