#!/usr/bin/env bash
# What the query digests cost: passthrough throughput and proxy CPU per statement
# with digests on (the default, digest_table_size = 2000) against digests off
# (digest_table_size = 0), in the same run, against one private MariaDB, driven by
# sysbench oltp_point_select (prepared statements: every execute is digested, its
# hot key read from the parameters) and, with TEXT=1 (the default), the same point
# selects over the text protocol (each statement lexed and fingerprinted).
#
# Two heatsink processes, no rules, one with digests on and one off; legs alternate
# (odd rounds "on" first), several rounds. Per leg: statements (sysbench events),
# statements/s, and the proxy's CPU time (user + system from /proc/PID/stat) over
# the leg. The report gives the ratios on/off per round and their median.
#
# In the same run, the digest path alone (examples/digest_bench.rs: fingerprint, hot
# key and one record per statement, single thread, CPU time per statement) for a
# point select as text and as a prepared execute, a 50-item IN list and a 100-row
# INSERT, set against the proxy's CPU per statement with digests off. CPU time, not
# wall time: on a shared machine the wall clock counts the waits for a core. The
# hardware instruction counters (`perf stat -e instructions:u`) are used when the
# machine exposes them; the report says whether it does.
#
#   scripts/bench-digest.sh                     # about 4 minutes
#   ROUNDS=3 DURATION=5 scripts/bench-digest.sh
#
# Environment: DURATION (10 s), ROUNDS (9), THREADS (16), TEXT (1), SKIP_BUILD=1,
# HEATSINK_BIN (default target/release/heatsink), OUT (bench/results/digest.md).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/mariadb.sh
source "$SCRIPT_DIR/lib/mariadb.sh"
cd "$HS_REPO_DIR"

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-9}
THREADS=${THREADS:-16}
TEXT=${TEXT:-1}
OUT=${OUT:-bench/results/digest.md}
TABLES=4
TABLE_SIZE=10000
export MARIADB_EXTRA_ARGS=${MARIADB_EXTRA_ARGS:---innodb-buffer-pool-size=256M}

hs_install_traps
[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink --example digest_bench
HEATSINK_BIN=${HEATSINK_BIN:-$HS_REPO_DIR/target/release/heatsink}
export HEATSINK_BIN
REV=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo " (uncommitted changes)")

hs_tmpdir_into WORK digest
RAW=$WORK/raw.tsv # round workload mode events seconds cpu_us
: >"$RAW"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

mariadb_start
hs_log "sysbench prepare ($TABLES tables × $TABLE_SIZE rows)"
sysbench oltp_point_select --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$MARIADB_PORT" \
  --mysql-user="$SB_USER" --mysql-password="$SB_PASSWORD" --mysql-db="$SB_DB" \
  --tables=$TABLES --table-size=$TABLE_SIZE prepare >"$WORK/prepare.log" 2>&1 ||
  { cat "$WORK/prepare.log" >&2; hs_die "sysbench prepare failed"; }

heatsink_start "$MARIADB_PORT"
ON_PID=$HEATSINK_PID ON_PORT=$HEATSINK_PORT
heatsink_start "$MARIADB_PORT" --digest-table-size 0
OFF_PID=$HEATSINK_PID OFF_PORT=$HEATSINK_PORT

# The text-protocol point select: one statement per event, uniform keys.
cat >"$WORK/text_point_select.lua" <<EOF
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
EOF
WORKLOADS=point_select
[[ $TEXT == 1 ]] && WORKLOADS="point_select text_point_select"

CLK_TCK=$(getconf CLK_TCK)
cpu_us() { awk -v t="$CLK_TCK" '{ printf "%d\n", ($14 + $15) * 1000000 / t }' "/proc/$1/stat"; }

# sysbench WORKLOAD PORT SECONDS LOG
run_sysbench() {
  local w=$1 port=$2 secs=$3 log=$4 test
  if [[ $w == point_select ]]; then test=oltp_point_select; else test=$WORK/$w.lua; fi
  hs_run sysbench "$test" --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$port" \
    --mysql-user="$SB_USER" --mysql-password="$SB_PASSWORD" --mysql-db="$SB_DB" \
    --tables=$TABLES --table-size=$TABLE_SIZE --threads="$THREADS" --time="$secs" \
    --report-interval=0 run >"$log" 2>&1
}

# leg ROUND WORKLOAD MODE -> a line in $RAW
leg() {
  local round=$1 w=$2 mode=$3 pid port log c0 c1 events secs
  if [[ $mode == on ]]; then pid=$ON_PID port=$ON_PORT; else pid=$OFF_PID port=$OFF_PORT; fi
  log=$WORK/$w-$mode-$round.log
  c0=$(cpu_us "$pid")
  run_sysbench "$w" "$port" "$DURATION" "$log" || { tail -n 20 "$log" >&2; hs_die "sysbench $w (digests $mode) failed"; }
  c1=$(cpu_us "$pid")
  events=$(sed -n 's/^ *total number of events: *\([0-9]*\)/\1/p' "$log" | sed -n 1p)
  secs=$(sed -n 's/^ *total time: *\([0-9.]*\)s/\1/p' "$log" | sed -n 1p)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$w" "$mode" "$events" "$secs" "$((c1 - c0))" >>"$RAW"
  hs_log "round $round $w digests $mode: $events statements in ${secs}s, proxy CPU $(((c1 - c0) / (events > 0 ? events : 1))) µs per statement"
}

for w in $WORKLOADS; do
  for mode in on off; do
    run_sysbench "$w" "$([[ $mode == on ]] && echo "$ON_PORT" || echo "$OFF_PORT")" 3 "$WORK/warmup.log" ||
      { tail -n 20 "$WORK/warmup.log" >&2; hs_die "warm-up $w failed"; }
  done
done
for ((round = 1; round <= ROUNDS; round++)); do
  for w in $WORKLOADS; do
    if ((round % 2)); then order="on off"; else order="off on"; fi
    for mode in $order; do leg "$round" "$w" "$mode"; done
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
hs_log "the digest path alone (examples/digest_bench)"
"$HS_REPO_DIR/target/release/examples/digest_bench" "${MICRO_ITERATIONS:-2000000}" >"$WORK/micro.md" 2>/dev/null ||
  hs_die "digest_bench failed"
if perf stat -e instructions:u -- true 2>&1 | grep -q "not supported"; then
  COUNTERS="not exposed by this machine (perf stat: instructions:u not supported): CPU time instead"
elif command -v perf >/dev/null; then
  COUNTERS="exposed, but this script reads CPU time"
else
  COUNTERS="perf not installed: CPU time instead"
fi
SB_VERSION=$(sysbench --version | awk '{print $2}')

B_REV=$REV B_VERSION=$MARIADB_VERSION B_SYSBENCH=$SB_VERSION B_LOAD_START=$load_start \
  B_LOAD_END=$load_end B_DURATION=$DURATION B_ROUNDS=$ROUNDS B_THREADS=$THREADS \
  B_WORKLOADS=$WORKLOADS B_COUNTERS=$COUNTERS python3 - "$RAW" "$OUT" "$WORK/micro.md" <<'PY'
import datetime, os, statistics, sys
raw, out, micro = sys.argv[1:4]
E = os.environ
rows = {}
for line in open(raw):
    r, w, m, ev, secs, cpu = line.rstrip("\n").split("\t")
    rows[(int(r), w, m)] = dict(events=int(ev or 0), secs=float(secs or 0), cpu=int(cpu))
rounds, workloads = int(E["B_ROUNDS"]), E["B_WORKLOADS"].split()
rr = range(1, rounds + 1)
med = statistics.median
def rate(r, w, m):
    x = rows[(r, w, m)]
    return x["events"] / max(x["secs"], 1e-9)
def cpu(r, w, m):
    x = rows[(r, w, m)]
    return x["cpu"] / max(x["events"], 1)
L = [
    "# Query digests: passthrough cost, digests on against off",
    "",
    f"- date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; heatsink {E['B_REV']}; MariaDB {E['B_VERSION']}, sysbench {E['B_SYSBENCH']}",
    f"- machine: {os.cpu_count()} cores, shared by sysbench, both proxies and the server; load average (1/5/15 min) at the start {E['B_LOAD_START']}, at the end {E['B_LOAD_END']}",
    f"- {rounds} rounds of {E['B_DURATION']} s per leg, {E['B_THREADS']} threads; two heatsink processes without rules, digests on (digest_table_size 2000) and off (0), legs back to back, order alternating",
    "- point_select: sysbench oltp_point_select (prepared statements, binary protocol); text_point_select: the same read as a text statement (`SELECT c FROM sbtestN WHERE id = K`)",
    "- CPU: user + system time of the proxy process over the leg (`/proc/PID/stat`) divided by the statements sysbench completed",
    f"- hardware instruction counters: {E['B_COUNTERS']}",
    "",
    "## On / off",
    "",
    "| workload | statements/s on | statements/s off | **throughput on / off** (median) | per round | CPU µs/statement on | off | **CPU on / off** (median) | per round |",
    "|---|---:|---:|---:|---|---:|---:|---:|---|",
]
for w in workloads:
    t = [rate(r, w, "on") / max(rate(r, w, "off"), 1e-9) for r in rr]
    c = [cpu(r, w, "on") / max(cpu(r, w, "off"), 1e-9) for r in rr]
    L.append(f"| {w} | {med(rate(r, w, 'on') for r in rr):,.0f} | {med(rate(r, w, 'off') for r in rr):,.0f} |"
             f" **{med(t):.3f}** | {', '.join(f'{x:.3f}' for x in t)} |"
             f" {med(cpu(r, w, 'on') for r in rr):.1f} | {med(cpu(r, w, 'off') for r in rr):.1f} |"
             f" **{med(c):.3f}** | {', '.join(f'{x:.3f}' for x in c)} |")
L += ["", "Ratios are medians of per-round ratios (the two legs of a round ran back to back).", ""]
# The digest path alone, against the proxy's CPU per statement with digests off.
off_cpu = {w: med(cpu(r, w, "off") for r in rr) for w in workloads}
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
L += ["",
      "## Raw numbers", "",
      "| round | workload | digests | statements | statements/s | proxy CPU ms | CPU µs per statement |",
      "|---:|---|---|---:|---:|---:|---:|"]
for r in rr:
    for w in workloads:
        for m in ("on", "off"):
            x = rows[(r, w, m)]
            L.append(f"| {r} | {w} | {m} | {x['events']:,} | {rate(r, w, m):,.0f} | {x['cpu'] / 1000:,.0f} | {cpu(r, w, m):.1f} |")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
