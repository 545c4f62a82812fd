"""The report of scripts/bench-advise.sh (bench/results/advise.md).

    python3 advise_report.py RAW CHECKS TOML ADVISE MIGRATE STATS OUT

RAW: one line per round, leg and stream (round leg stream events seconds errors p50
p99); the run's facts come in B_* environment variables (see the script).
"""
import datetime, math, os, statistics, sys
raw, checks, toml, advise, migrate, stats, out = sys.argv[1:8]
E = os.environ
rows = {}
for line in open(raw):
    r, leg, s, ev, secs, err, p50, p99 = line.rstrip("\n").split("\t")
    rows[(int(r), leg, s)] = dict(rate=int(ev or 0) / max(float(secs or 0), 1e-9), errors=int(err or 0),
                                  p50=float(p50), p99=float(p99))
R = range(1, int(E["B_ROUNDS"]) + 1)
med = statistics.median
streams = ["counter", "ring", "rollup", "partition", "retention", "timeline", "decoys"]
mix = [s for s in streams if s != "retention"]
def get(r, leg, s, k):
    return rows[(r, leg, s)][k]
def total(r, leg):
    return sum(get(r, leg, s, "rate") for s in mix)
def ratio(a, b, s=None, k="rate"):
    if s is None:
        per = [total(r, a) / max(total(r, b), 1e-9) for r in R]
    else:
        per = [get(r, a, s, k) / max(get(r, b, s, k), 1e-9) for r in R]
    return med(per), per
label = {
    "counter": "counter: hot-key increments (`hits`)",
    "ring": "ring: visits recorded + newest-5 reads (`visits`)",
    "rollup": "rollup: log inserts + 7-day aggregates (`plays`)",
    "partition": "partition: lookups by key (`Messages`)",
    "retention": "partition: deletes by age, 1 client at a fixed rate (`Messages`)",
    "timeline": "timeline: friends-timeline JOIN (`message` × `follower`)",
    "decoys": "decoys: cold increments, id lookups, inserts, small aggregates",
}
L = [
    "# The advise-then-apply gain on the mixed workload",
    "",
    f"- date: {E.get('B_DATE') or format(datetime.datetime.utcnow(), '%Y-%m-%d %H:%M')} UTC; heatsink {E['B_REV']}; MariaDB {E['B_VERSION']}; sysbench {E['B_SYSBENCH']} (Lua clients, text protocol, autocommit)",
    f"- machine: {os.cpu_count()} cores shared by sysbench, both proxies and the server (and other work); load average (1/5/15 min) at the start {E['B_LOAD_START']}, at the end {E['B_LOAD_END']}",
    f"- the mixed workload of tests/advise.rs at {int(E['B_ROWS']):,} rows per large table (`plays`, `Messages`, `orders`, `message`); streams and their clients: {E['B_THREADS']}",
    f"- discovery {E['B_DISCOVERY']} s through heatsink without rules; then `heatsink advise --admin … --backend-url … --large-rows {E['B_LARGE']} --format toml`, `check`, `check --backend-url`, `migrate --apply`, `RELOAD RULES` (nothing hand-written: the rules below are what advise printed)",
    f"- {E['B_ROUNDS']} rounds of {E['B_DURATION']} s per leg, legs rotated every round: **A** through heatsink without rules, **B** through heatsink with the advised rules, **direct** to MariaDB; A and direct on an unmigrated copy of the tables (`plain`), B on the migrated ones (`app`)",
    "",
    "## Whole mix (every stream but the fixed-rate deletes; medians of per-round ratios)",
    "",
    "| ratio | median | per round |",
    "|---|---:|---|",
]
for a, b in [("B", "A"), ("B", "direct"), ("A", "direct")]:
    m, per = ratio(a, b)
    L.append(f"| {a} / {b}, statements/s summed | **{m:.2f}** | {', '.join(f'{x:.2f}' for x in per)} |")
def geo(a, b):
    per = [math.exp(statistics.fmean(math.log(max(get(r, a, s, "rate"), 1e-9) / max(get(r, b, s, "rate"), 1e-9)) for s in mix)) for r in R]
    return med(per), per
for a, b in [("B", "A"), ("B", "direct")]:
    m, per = geo(a, b)
    L.append(f"| {a} / {b}, geometric mean of the {len(mix)} streams' ratios (each counts once) | **{m:.2f}** | {', '.join(f'{x:.2f}' for x in per)} |")
if E.get("B_READING") and os.path.exists(E["B_READING"]):
    L += ["", open(E["B_READING"]).read().rstrip()]
L += ["", "## Per hot spot", "",
      "Statements/s and latency are medians over the rounds of each leg's figure; the ratios are medians of per-round ratios.", "",
      "| stream | A /s | B /s | direct /s | **B / A** | **B / direct** | p50 ms A / B / direct | p99 ms A / B / direct | ignored errors A / B / direct |",
      "|---|---:|---:|---:|---:|---:|---|---|---|"]
for s in streams:
    m = {leg: med([get(r, leg, s, "rate") for r in R]) for leg in ("A", "B", "direct")}
    p50 = {leg: med([get(r, leg, s, "p50") for r in R]) for leg in ("A", "B", "direct")}
    p99 = {leg: med([get(r, leg, s, "p99") for r in R]) for leg in ("A", "B", "direct")}
    err = {leg: sum(get(r, leg, s, "errors") for r in R) for leg in ("A", "B", "direct")}
    ba, _ = ratio("B", "A", s)
    bd, _ = ratio("B", "direct", s)
    if s == "retention":
        ba, _ = ratio("A", "B", s, "p50")
        bd, _ = ratio("direct", "B", s, "p50")
        ratios = f"p50 {ba:.2f} × faster | p50 {bd:.2f} × faster"
    else:
        ratios = f"**{ba:.2f}** | **{bd:.2f}**"
    L.append(f"| {label[s]} | {m['A']:,.0f} | {m['B']:,.0f} | {m['direct']:,.0f} | {ratios} | "
             f"{p50['A']:.2f} / {p50['B']:.2f} / {p50['direct']:.2f} | {p99['A']:.2f} / {p99['B']:.2f} / {p99['direct']:.2f} | "
             f"{err['A']} / {err['B']} / {err['direct']} |")
L += ["", "## Exact after the legs", ""] + [f"- {l.strip()}" for l in open(checks) if l.strip()]
L += ["", "`SHOW RULE STATS` on the admin port after the legs:", "", "```", open(stats).read().rstrip(), "```"]
L += ["", "## What advise printed", "", "```", open(advise).read().rstrip(), "```", "",
      "The rule file (`--format toml`), used as it is:", "", "```toml", open(toml).read().rstrip(), "```", "",
      "`heatsink migrate --apply`:", "", "```", open(migrate).read().rstrip()[-6000:], "```"]
L += ["", "## Raw numbers (statements/s; latency in ms from sysbench's histogram)", "",
      "| round | leg | stream | /s | p50 | p99 | ignored errors |", "|---:|---|---|---:|---:|---:|---:|"]
for (r, leg, s), x in sorted(rows.items()):
    L.append(f"| {r} | {leg} | {s} | {x['rate']:,.1f} | {x['p50']:.2f} | {x['p99']:.2f} | {x['errors']} |")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
