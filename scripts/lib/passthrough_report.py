"""Turns the raw measurements of scripts/bench-passthrough.sh into Markdown.

Input: $RAW, a TSV of `leg  metric  round  value` lines, plus run facts in the
environment (see the script). Output: Markdown on stdout.
"""

import json
import os
import statistics
from collections import defaultdict

env = os.environ
LEGS = ["direct", "heatsink", "haproxy"]

# data[leg][metric] = {round: value}
data = defaultdict(lambda: defaultdict(dict))
failures = []
with open(env["RAW"]) as f:
    for line in f:
        parts = line.rstrip("\n").split("\t", 3)
        if len(parts) != 4:
            continue
        leg, metric, rnd, value = parts
        if metric == "failure":
            failures.append(f"{leg} round {rnd}: {value}")
            continue
        if metric == "lg1_json":
            try:
                j = json.loads(value)
            except ValueError:
                failures.append(f"{leg} round {rnd}: unreadable loadgen output")
                continue
            for k in ("ops_per_sec", "p50_us", "p95_us", "p99_us", "errors"):
                data[leg]["lg1_" + k][rnd] = float(j[k])
            continue
        try:
            data[leg][metric][rnd] = float(value)
        except ValueError:
            pass


def values(leg, metric):
    return list(data[leg][metric].values())


def med(leg, metric):
    v = values(leg, metric)
    return statistics.median(v) if v else None


def fmt(x, digits=0):
    if x is None:
        return "n/a"
    return f"{x:,.{digits}f}"


def spread(leg, metric, digits=0, scale=1.0):
    v = values(leg, metric)
    if not v:
        return "n/a"
    m = statistics.median(v) * scale
    if len(v) == 1:
        return fmt(m, digits)
    return f"{fmt(m, digits)} ({fmt(min(v) * scale, digits)}–{fmt(max(v) * scale, digits)})"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def per_round_ratio(num_leg, den_leg, metric):
    r = []
    for rnd, a in data[num_leg][metric].items():
        b = data[den_leg][metric].get(rnd)
        if b:
            r.append(a / b)
    return statistics.median(r) if r else None


def diff(a, b):
    if a is None or b is None:
        return None
    return a - b


def per_round_diff(num_leg, den_leg, metric, scale=1.0):
    r = []
    for rnd, a in data[num_leg][metric].items():
        b = data[den_leg][metric].get(rnd)
        if b is not None:
            r.append((a - b) * scale)
    return statistics.median(r) if r else None


def verdict(x, ok):
    if x is None:
        return "n/a"
    return "yes" if ok(x) else "**no**"


out = []
p = out.append
p("# Passthrough overhead: heatsink vs haproxy (TCP) vs direct")
p("")
p(f"- date: {env.get('BENCH_DATE', '?')}")
p(
    f"- machine: {env.get('NPROC', '?')} cores ({env.get('CPU_MODEL', '?')}), "
    f"Linux {env.get('KERNEL', '?')}"
)
p(
    f"- MariaDB {env.get('MARIADB_VERSION', '?')}, {env.get('SYSBENCH_VERSION', '?')}, "
    f"HAProxy {env.get('HAPROXY_VERSION', '?')}"
)
p(
    f"- load average (1/5/15 min) before the rounds: {env.get('LOADAVG_START', '?')}, "
    f"at the end: {env.get('LOADAVG_END', '?')} (above ~2 on this machine means other "
    "work competed for the CPUs: expect wide spreads)"
)
p(f"- heatsink: {env.get('GIT_REV', '?')}{env.get('GIT_DIRTY', '')}, empty rules dir")
p(
    f"- settings: {env.get('ROUNDS')} rounds, legs interleaved (order rotated each round); "
    f"sysbench oltp_point_select {env.get('DURATION')} s per measurement, "
    f"{env.get('TABLES')} tables × {env.get('TABLE_SIZE')} rows; loadgen 1 connection "
    f"{env.get('LAT_DURATION')} s (+1 s warmup), prepared `{env.get('LAT_SQL')}`"
)
p("- all three legs ran on this machine, in this run, against the same mariadbd;")
p("  figures are medians over rounds, (min–max) in brackets")
p("")

qps16 = {leg: med(leg, "ps16_qps") for leg in LEGS}
qps1 = {leg: med(leg, "ps1_qps") for leg in LEGS}
p50 = {leg: med(leg, "lg1_p50_us") for leg in LEGS}
avg1 = {leg: med(leg, "ps1_avg_ms") for leg in LEGS}

p("## Ratios")
p("")
p("| measure | value | median of per-round values | goal | met |")
p("|---|---:|---:|---|---|")
hs_ha = ratio(qps16["heatsink"], qps16["haproxy"])
p(
    f"| QPS heatsink / haproxy, 16 threads | {fmt(hs_ha, 3)} | "
    f"{fmt(per_round_ratio('heatsink', 'haproxy', 'ps16_qps'), 3)} | ≥ 0.9 | "
    f"{verdict(hs_ha, lambda x: x >= 0.9)} |"
)
for num, den, metric, label in [
    ("heatsink", "direct", "ps16_qps", "QPS heatsink / direct, 16 threads"),
    ("haproxy", "direct", "ps16_qps", "QPS haproxy / direct, 16 threads"),
    ("heatsink", "haproxy", "ps1_qps", "QPS heatsink / haproxy, 1 thread"),
    ("heatsink", "direct", "ps1_qps", "QPS heatsink / direct, 1 thread"),
    ("haproxy", "direct", "ps1_qps", "QPS haproxy / direct, 1 thread"),
]:
    r = ratio(med(num, metric), med(den, metric))
    p(f"| {label} | {fmt(r, 3)} | {fmt(per_round_ratio(num, den, metric), 3)} | | |")
added = diff(p50["heatsink"], p50["direct"])
p(
    f"| added p50 latency, heatsink − direct, 1 connection (loadgen) | {fmt(added, 1)} µs | "
    f"{fmt(per_round_diff('heatsink', 'direct', 'lg1_p50_us'), 1)} µs | ≤ 50 µs | "
    f"{verdict(added, lambda x: x <= 50)} |"
)
p(
    f"| added p50 latency, haproxy − direct, 1 connection (loadgen) | "
    f"{fmt(diff(p50['haproxy'], p50['direct']), 1)} µs | "
    f"{fmt(per_round_diff('haproxy', 'direct', 'lg1_p50_us'), 1)} µs | | |"
)
a = diff(avg1["heatsink"], avg1["direct"])
p(
    f"| added avg latency, heatsink − direct, 1 thread (sysbench, 10 µs resolution) | "
    f"{fmt(a * 1000 if a is not None else None, 0)} µs | "
    f"{fmt(per_round_diff('heatsink', 'direct', 'ps1_avg_ms', 1000.0), 0)} µs | | |"
)
p("")

p("## Raw numbers")
p("")
p(
    "| leg | 16 threads QPS | 16t avg ms | 16t p95 ms | 1 thread QPS | 1t avg ms | "
    "loadgen 1c ops/s | loadgen p50 µs | p95 µs | p99 µs | errors |"
)
p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for leg in LEGS:
    errors = sum(
        sum(values(leg, m)) for m in ("ps16_errors", "ps1_errors", "lg1_errors")
    )
    p(
        f"| {leg} | {spread(leg, 'ps16_qps')} | {spread(leg, 'ps16_avg_ms', 2)} | "
        f"{spread(leg, 'ps16_p95_ms', 2)} | {spread(leg, 'ps1_qps')} | "
        f"{spread(leg, 'ps1_avg_ms', 3)} | {spread(leg, 'lg1_ops_per_sec')} | "
        f"{spread(leg, 'lg1_p50_us', 1)} | {spread(leg, 'lg1_p95_us', 1)} | "
        f"{spread(leg, 'lg1_p99_us', 1)} | {errors:.0f} |"
    )
p("")

p("### Per round")
p("")
p("| round | leg | 16t QPS | 1t QPS | loadgen p50 µs |")
p("|---:|---|---:|---:|---:|")
rounds = sorted(
    {r for leg in LEGS for m in data[leg].values() for r in m}, key=lambda s: int(s)
)
for rnd in rounds:
    for leg in LEGS:
        if data[leg]["ps16_qps"].get(rnd) is None and data[leg]["lg1_p50_us"].get(rnd) is None:
            continue
        p(
            f"| {rnd} | {leg} | {fmt(data[leg]['ps16_qps'].get(rnd))} | "
            f"{fmt(data[leg]['ps1_qps'].get(rnd))} | "
            f"{fmt(data[leg]['lg1_p50_us'].get(rnd), 1)} |"
        )
p("")

p(f"## oltp_read_write, 8 threads, {env.get('RW_DURATION')} s")
p("")
p("| leg | TPS | QPS | ignored errors | of which InnoDB deadlocks | reconnects | sysbench exit |")
p("|---|---:|---:|---:|---:|---:|---:|")
for leg in ("direct", "heatsink"):
    p(
        f"| {leg} | {fmt(med(leg, 'rw_tps'), 1)} | {fmt(med(leg, 'rw_qps'))} | "
        f"{fmt(med(leg, 'rw_errors'))} | {fmt(med(leg, 'rw_deadlocks'))} | "
        f"{fmt(med(leg, 'rw_reconnects'))} | {fmt(med(leg, 'rw_exit'))} |"
    )
hs_exit = med("heatsink", "rw_exit")
hs_errors = med("heatsink", "rw_errors")
hs_deadlocks = med("heatsink", "rw_deadlocks") or 0
hs_reconnects = med("heatsink", "rw_reconnects")
p("")
if hs_exit == 0 and hs_errors == 0 and hs_reconnects == 0:
    p("Through heatsink: finished with zero errors and zero reconnects.")
elif hs_exit == 0 and hs_reconnects == 0 and hs_errors is not None and hs_errors <= hs_deadlocks:
    p(
        f"Through heatsink: finished with zero reconnects and no errors other than "
        f"{hs_errors:.0f} InnoDB deadlock(s) (error 1213, counted by the server in the same "
        "window), which sysbench retries; the proxy passed them through."
    )
else:
    p(
        "Through heatsink: **did not finish cleanly** (see the table: errors that are not "
        "deadlocks, reconnects, or a non-zero exit)."
    )
p("")

if failures:
    p("## Failures")
    p("")
    for f_ in failures:
        p(f"- {f_}")
    p("")

print("\n".join(out))
