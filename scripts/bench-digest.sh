#!/usr/bin/env bash
# What the query digests cost: passthrough throughput and proxy CPU per statement
# with digests on (the default, digest_table_size = 2000) against digests off
# (digest_table_size = 0), against one private MariaDB, driven by sysbench
# oltp_point_select (prepared statements: every execute is digested, its hot key
# read from the parameters) and, with TEXT=1 (the default), the same point selects
# over the text protocol (each statement lexed and fingerprinted).
#
# The two legs of a comparison run at the same time, so that both proxies see the
# same machine at the same moment: two sysbench processes, one per proxy, each with
# half the threads, started together (odd rounds the first proxy's first, even
# rounds the second's). Nothing is pinned. Per proxy over the same window: the
# statements its sysbench completed, statements/s, and its CPU time (the run time
# of its threads from /proc/PID/task/*/schedstat, read before both start and after
# both end). Three heatsink
# processes without rules: ON (digests on), OFF and NULL (both off). Each round runs,
# per workload, the pair ON | OFF and then the null pair NULL | OFF: the null pair's
# ratios are what the method itself scatters, with nothing between its two proxies
# but their process. The report gives each round's ratios and their medians.
#
# In the same run, the digest path alone (examples/digest_bench.rs: fingerprint, hot
# key and one record per statement, single thread, CPU time per statement) for a
# point select as text and as a prepared execute, a 50-item IN list and a 100-row
# INSERT, set against the proxy's CPU per statement with digests off. CPU time, not
# wall time: on a shared machine the wall clock counts the waits for a core. The
# hardware instruction counters (`perf stat -e instructions:u`) are used when the
# machine exposes them; the report says whether it does.
#
# With PERF=1 (the default when perf is installed and may profile the proxies), one
# more text pair ON | OFF is profiled (`perf record -e cpu-clock -g` of both
# proxies over the same window) and the report lists the top symbols' shares of
# each proxy's samples side by side.
#
#   scripts/bench-digest.sh                     # about 7 minutes
#   ROUNDS=3 DURATION=5 scripts/bench-digest.sh
#
# Each sysbench sends RATE statements/s (`--rate`; RATE=0: as many as its proxy
# answers): both proxies of a window then do the same work at the same pace, and
# their CPU per statement is compared at equal load. Unthrottled, the proxy whose
# sysbench starts first gets up to twice the statements of the other, and CPU per
# statement follows throughput (fewer statements per wake-up cost more each).
#
# Environment: DURATION (10 s per window), ROUNDS (7), THREADS (16, split between
# the pair), RATE (2000; 0: unthrottled), TEXT (1), PERF, SKIP_BUILD=1, HEATSINK_BIN
# (default target/release/heatsink), OUT (bench/results/digest.md).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/mariadb.sh
source "$SCRIPT_DIR/lib/mariadb.sh"
cd "$HS_REPO_DIR"

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-7}
THREADS=${THREADS:-16}
RATE=${RATE:-2000}
TEXT=${TEXT:-1}
OUT=${OUT:-bench/results/digest.md}
TABLES=4
TABLE_SIZE=10000
HALF=$(((THREADS + 1) / 2))
export MARIADB_EXTRA_ARGS=${MARIADB_EXTRA_ARGS:---innodb-buffer-pool-size=256M}
if [[ -z ${PERF:-} ]]; then
  PERF=0
  command -v perf >/dev/null && perf record -q -e cpu-clock -o /dev/null -- true >/dev/null 2>&1 && PERF=1
fi

hs_install_traps
[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink --example digest_bench
HEATSINK_BIN=${HEATSINK_BIN:-$HS_REPO_DIR/target/release/heatsink}
export HEATSINK_BIN
REV=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo " (uncommitted changes)")

hs_tmpdir_into WORK digest
RAW=$WORK/raw.tsv # round workload pair proxy events seconds cpu_us
: >"$RAW"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

mariadb_start
hs_log "sysbench prepare ($TABLES tables × $TABLE_SIZE rows)"
sysbench oltp_point_select --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$MARIADB_PORT" \
  --mysql-user="$SB_USER" --mysql-password="$SB_PASSWORD" --mysql-db="$SB_DB" \
  --tables=$TABLES --table-size=$TABLE_SIZE prepare >"$WORK/prepare.log" 2>&1 ||
  { cat "$WORK/prepare.log" >&2; hs_die "sysbench prepare failed"; }

declare -A PID PORT
heatsink_start "$MARIADB_PORT"
PID[on]=$HEATSINK_PID PORT[on]=$HEATSINK_PORT
heatsink_start "$MARIADB_PORT" --digest-table-size 0
PID[off]=$HEATSINK_PID PORT[off]=$HEATSINK_PORT
heatsink_start "$MARIADB_PORT" --digest-table-size 0
PID[null]=$HEATSINK_PID PORT[null]=$HEATSINK_PORT

# The text-protocol point select: one statement per event, uniform keys.
cat >"$WORK/text_point_select.lua" <<LUA
function thread_init()
  drv = sysbench.sql.driver()
  con = drv:connect()
end
function event()
  con:query(string.format("SELECT c FROM sbtest%d WHERE id = %d",
    sysbench.rand.uniform(1, $TABLES), sysbench.rand.uniform(1, $TABLE_SIZE)))
end
function thread_done()
  con:disconnect()
end
LUA
WORKLOADS=point_select
[[ $TEXT == 1 ]] && WORKLOADS="point_select text_point_select"

# A process's CPU time in µs: the scheduler's run time of each of its threads
# (/proc/PID/task/TID/schedstat, ns), not /proc/PID/stat's user + system, which
# the kernel samples at clock ticks (a proxy running in bursts of tens of µs
# is charged whole ticks: several % of noise over a window of a few seconds).
cpu_us() { cat /proc/"$1"/task/*/schedstat | awk '{ s += $1 } END { printf "%d\n", s / 1000 }'; }

# sysbench WORKLOAD PORT SECONDS THREADS LOG (in the foreground)
run_sysbench() {
  local w=$1 port=$2 secs=$3 threads=$4 log=$5 test
  if [[ $w == point_select ]]; then test=oltp_point_select; else test=$WORK/$w.lua; fi
  sysbench "$test" --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$port" \
    --mysql-user="$SB_USER" --mysql-password="$SB_PASSWORD" --mysql-db="$SB_DB" \
    --tables=$TABLES --table-size=$TABLE_SIZE --threads="$threads" --time="$secs" \
    --rate="$RATE" --report-interval=0 run >"$log" 2>&1
}

# together ROUND WORKLOAD PAIR A B: proxies A and B driven at the same time, HALF
# threads each, the first started first on odd rounds -> two lines in $RAW. With
# PERF_DIR set, both proxies are profiled over the window.
together() {
  local round=$1 w=$2 pair=$3 a=$4 b=$5 first second p ca0 cb0 ca1 cb1 rc=0
  local -A sb
  if ((round % 2)); then first=$a second=$b; else first=$b second=$a; fi
  local perfs=()
  if [[ -n ${PERF_DIR:-} ]]; then
    for p in "$a" "$b"; do
      perf record -q -e cpu-clock -g -p "${PID[$p]}" -o "$PERF_DIR/$p.data" 2>"$PERF_DIR/$p.err" &
      perfs+=("$!")
      hs_register_pid "$!"
    done
    sleep 1
  fi
  ca0=$(cpu_us "${PID[$a]}") cb0=$(cpu_us "${PID[$b]}")
  for p in "$first" "$second"; do
    run_sysbench "$w" "${PORT[$p]}" "$DURATION" "$HALF" "$WORK/$w-$pair-$p-$round.log" &
    sb[$p]=$!
    hs_register_pid "${sb[$p]}"
  done
  for p in "$first" "$second"; do
    wait "${sb[$p]}" || rc=$?
    hs_forget_pid "${sb[$p]}"
  done
  ca1=$(cpu_us "${PID[$a]}") cb1=$(cpu_us "${PID[$b]}")
  for p in "${perfs[@]}"; do
    kill -INT "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    hs_forget_pid "$p"
  done
  if ((rc != 0)); then
    tail -n 20 "$WORK/$w-$pair-$a-$round.log" "$WORK/$w-$pair-$b-$round.log" >&2
    hs_die "sysbench $w ($pair pair) failed"
  fi
  local line=""
  for p in "$a" "$b"; do
    local log=$WORK/$w-$pair-$p-$round.log events secs cpu
    events=$(sed -n 's/^ *total number of events: *\([0-9]*\)/\1/p' "$log" | sed -n 1p)
    secs=$(sed -n 's/^ *total time: *\([0-9.]*\)s/\1/p' "$log" | sed -n 1p)
    if [[ $p == "$a" ]]; then cpu=$((ca1 - ca0)); else cpu=$((cb1 - cb0)); fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$w" "$pair" "$p" "$events" "$secs" "$cpu" >>"$RAW"
    line+=" $p: $events statements, $((cpu / (events > 0 ? events : 1))) µs CPU each;"
  done
  hs_log "round $round $w ${pair} pair:${line%;}"
}

hs_log "warm-up"
for w in $WORKLOADS; do
  for p in on off null; do
    run_sysbench "$w" "${PORT[$p]}" 3 "$HALF" "$WORK/warmup.log" ||
      { tail -n 20 "$WORK/warmup.log" >&2; hs_die "warm-up $w failed"; }
  done
done
for ((round = 1; round <= ROUNDS; round++)); do
  for w in $WORKLOADS; do
    together "$round" "$w" onoff on off
    together "$round" "$w" null null off
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

PROFILE=""
if [[ $PERF == 1 ]]; then
  PW=text_point_select
  [[ $TEXT == 1 ]] || PW=point_select
  hs_log "profile: one more $PW pair, perf record of both proxies"
  PERF_DIR=$WORK/perf
  mkdir -p "$PERF_DIR"
  together 0 "$PW" profile on off
  unset PERF_DIR
  for p in on off; do
    perf report -i "$WORK/perf/$p.data" --no-children --sort symbol -g none --stdio \
      2>/dev/null | grep -E '^ +[0-9.]+%' >"$WORK/perf/$p.txt" || true
  done
  PROFILE=$PW
fi

hs_log "the digest path alone (examples/digest_bench)"
"$HS_REPO_DIR/target/release/examples/digest_bench" "${MICRO_ITERATIONS:-2000000}" >"$WORK/micro.md" 2>/dev/null ||
  hs_die "digest_bench failed"
counters=$(perf stat -e instructions:u -- true 2>&1 || true)
if [[ $counters == *"not supported"* ]]; then
  COUNTERS="not exposed by this machine (perf stat: instructions:u not supported): CPU time instead"
elif command -v perf >/dev/null; then
  COUNTERS="exposed, but this script reads CPU time"
else
  COUNTERS="perf not installed: CPU time instead"
fi
SB_VERSION=$(sysbench --version | awk '{print $2}')

B_REV=$REV B_VERSION=$MARIADB_VERSION B_SYSBENCH=$SB_VERSION B_LOAD_START=$load_start \
  B_LOAD_END=$load_end B_DURATION=$DURATION B_ROUNDS=$ROUNDS B_THREADS=$THREADS B_HALF=$HALF \
  B_WORKLOADS=$WORKLOADS B_RATE=$RATE B_COUNTERS=$COUNTERS B_PROFILE=$PROFILE python3 - "$RAW" "$OUT" "$WORK/micro.md" "$WORK/perf" <<'PY'
import datetime, os, re, statistics, sys
raw, out, micro, perfdir = sys.argv[1:5]
E = os.environ
rows = {}
for line in open(raw):
    r, w, pair, p, ev, secs, cpu = line.rstrip("\n").split("\t")
    rows[(int(r), w, pair, p)] = dict(events=int(ev or 0), secs=float(secs or 0), cpu=int(cpu))
rounds, workloads = int(E["B_ROUNDS"]), E["B_WORKLOADS"].split()
rr = range(1, rounds + 1)
med = statistics.median
PAIRS = {"onoff": ("on", "off"), "null": ("null", "off")}
def rate(r, w, pair, p):
    x = rows[(r, w, pair, p)]
    return x["events"] / max(x["secs"], 1e-9)
def cpu(r, w, pair, p):
    x = rows[(r, w, pair, p)]
    return x["cpu"] / max(x["events"], 1)
def ratios(w, pair, f):
    a, b = PAIRS[pair]
    return [f(r, w, pair, a) / max(f(r, w, pair, b), 1e-9) for r in rr]
def spread(xs):
    return f"{min(xs):.3f}–{max(xs):.3f}"
L = [
    "# Query digests: passthrough cost, digests on against off",
    "",
    f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; heatsink {E['B_REV']}; MariaDB {E['B_VERSION']}, sysbench {E['B_SYSBENCH']}",
    f"- machine: {os.cpu_count()} cores, shared by sysbench, the proxies and the server (and other work); load average (1/5/15 min) at the start {E['B_LOAD_START']}, at the end {E['B_LOAD_END']}",
    f"- {rounds} rounds; per round and workload two windows of {E['B_DURATION']} s: the pair **on | off** (digests on: digest_table_size 2000; off: 0), then the **null pair** null | off (both off); in a window both proxies are driven at the same time, {E['B_HALF']} sysbench threads each ({E['B_THREADS']} in all), started together (odd rounds the first named first); three heatsink processes without rules, nothing pinned",
    "- pace: " + (f"each sysbench sends {int(E['B_RATE']):,} statements/s (`--rate`): both proxies do the same work at the same pace" if int(E["B_RATE"]) > 0 else "unthrottled: each sysbench sends as fast as its proxy answers"),
    "- point_select: sysbench oltp_point_select (prepared statements, binary protocol); text_point_select: the same read as a text statement (`SELECT c FROM sbtestN WHERE id = K`)",
    "- CPU: run time of each proxy's threads over the same window (`/proc/PID/task/*/schedstat`, read before both sysbench start and after both end; not `/proc/PID/stat`, which samples at clock ticks) divided by the statements its sysbench completed",
    f"- hardware instruction counters: {E['B_COUNTERS']}",
    "",
    "## On / off, and the null pair",
    "",
    "Ratios are first / second of the pair, per round (both in the same window) and their median; pooled: the ratio of CPU per statement over all rounds together (total CPU / total statements).",
    "",
    "| workload | pair | statements/s (medians) | **CPU per statement, ratio** (median) | pooled | range | per round | **statements/s, ratio** (median) | range | per round |",
    "|---|---|---|---:|---:|---|---|---:|---|---|",
]
summary = {}
for w in workloads:
    for pair, label in (("onoff", "on / off"), ("null", "null / off (both off)")):
        a, b = PAIRS[pair]
        c = ratios(w, pair, cpu)
        t = ratios(w, pair, rate)
        summary[(w, pair)] = (med(c), c, med(t), t)
        tot = lambda p, k: sum(rows[(r, w, pair, p)][k] for r in rr)
        pooled = (tot(a, "cpu") / max(tot(a, "events"), 1)) / max(tot(b, "cpu") / max(tot(b, "events"), 1), 1e-9)
        L.append(f"| {w} | {label} | {med(rate(r, w, pair, a) for r in rr):,.0f} / {med(rate(r, w, pair, b) for r in rr):,.0f} |"
                 f" **{med(c):.3f}** | {pooled:.3f} | {spread(c)} | {', '.join(f'{x:.3f}' for x in c)} |"
                 f" **{med(t):.3f}** | {spread(t)} | {', '.join(f'{x:.3f}' for x in t)} |")
L += ["", "CPU µs per statement (medians): " + "; ".join(
    f"{w}: on {med(cpu(r, w, 'onoff', 'on') for r in rr):.1f}, off {med(cpu(r, w, 'onoff', 'off') for r in rr):.1f}, "
    f"null {med(cpu(r, w, 'null', 'null') for r in rr):.1f}" for w in workloads) + ".", ""]
# The digest path alone, against the proxy's CPU per statement with digests off.
off_cpu = {w: med(cpu(r, w, "onoff", "off") for r in rr) for w in workloads}
against = {"point select, text (COM_QUERY)": "text_point_select",
           "point select, prepared (COM_STMT_EXECUTE)": "point_select"}
L += ["## The digest path alone", "",
      "`examples/digest_bench.rs`, single thread, CPU time (`/proc/thread-self/schedstat`) per statement: fingerprint, hot key and one `Digests::record` into a table holding the row (steady traffic).", "",
      "| statement | bytes | iterations | CPU ns per statement | share of the proxy's CPU per statement (digests off, median) |",
      "|---|---:|---:|---:|---:|"]
for line in open(micro):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 4 or not cells[3].isdigit():
        continue
    w = against.get(cells[0])
    share = f"{int(cells[3]) / 1000 / off_cpu[w] * 100:.1f} % of {off_cpu[w]:.1f} µs" if w in off_cpu else ""
    L.append(f"| {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | {share} |")
L.append("")
if E.get("B_PROFILE"):
    def load(p):
        d = {}
        try:
            for line in open(os.path.join(perfdir, p + ".txt")):
                m = re.match(r"\s*([0-9.]+)%\s+\[(.)\]\s+(.*\S)", line)
                if m:
                    name = re.split(r"\s{2,}", m.group(3))[0]
                    d[name] = (float(m.group(1)), m.group(2))
        except OSError:
            pass
        return d
    on, off = load("on"), load("off")
    keys = sorted(set(on) | set(off), key=lambda k: -max(on.get(k, (0,))[0], off.get(k, (0,))[0]))
    pw = E["B_PROFILE"]
    x = rows.get((0, pw, "profile", "on")), rows.get((0, pw, "profile", "off"))
    L += ["## Profile of both proxies in one window", "",
          f"One more {pw} pair on | off, `perf record -e cpu-clock -g -p PID` of each proxy over the same window "
          f"({x[0]['events']:,} and {x[1]['events']:,} statements; {x[0]['cpu'] / max(x[0]['events'], 1):.1f} and {x[1]['cpu'] / max(x[1]['events'], 1):.1f} µs CPU each). "
          "Self time per symbol, share of each proxy's samples (≥ 0.2 % in either; `[k]` kernel).", "",
          "| symbol | on % | off % | on − off |", "|---|---:|---:|---:|"]
    for k in keys[:40]:
        a, b = on.get(k, (0.0, "")), off.get(k, (0.0, ""))
        kind = a[1] or b[1]
        name = k.replace("|", "\\|")
        if len(name) > 90:
            name = name[:87] + "…"
        L.append(f"| `[{kind}]` {name} | {a[0]:.2f} | {b[0]:.2f} | {a[0] - b[0]:+.2f} |")
    digest_path = lambda d: sum(v[0] for k, v in d.items() if "heatsink::digest::" in k or "sqltok" in k)
    ours = lambda d: sum(v[0] for k, v in d.items() if v[1] == "." and "heatsink::" in k)
    L += ["", f"Digest path (symbols of `heatsink::digest` and the lexer `sqltok`): {digest_path(on):.2f} % of the on proxy's samples, {digest_path(off):.2f} % of the off proxy's; "
          f"all of heatsink's own symbols: {ours(on):.1f} % and {ours(off):.1f} %.", ""]
L += ["## Raw numbers", "",
      "| round | workload | pair | proxy | statements | statements/s | proxy CPU ms | CPU µs per statement |",
      "|---:|---|---|---|---:|---:|---:|---:|"]
for r in rr:
    for w in workloads:
        for pair in ("onoff", "null"):
            for p in PAIRS[pair]:
                x = rows[(r, w, pair, p)]
                L.append(f"| {r} | {w} | {pair} | {p} | {x['events']:,} | {rate(r, w, pair, p):,.0f} | {x['cpu'] / 1000:,.0f} | {cpu(r, w, pair, p):.1f} |")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
