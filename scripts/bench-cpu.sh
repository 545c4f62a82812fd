#!/usr/bin/env bash
# What the proxy costs per client statement: heatsink's CPU time per statement against
# haproxy's (TCP mode) per forwarded statement, in the same run, against one private
# MariaDB, driven by sysbench (its Lua client costs CPU as real drivers do).
#
# Workloads (each through haproxy to the plain tables, and through heatsink with its
# rules at their defaults, group commit on):
#   point_select  sysbench oltp_point_select (prepared), no rule     THREADS_PS (16)
#   counter       UPDATE hits SET cnt = cnt + 1 WHERE slug = 'hot'   THREADS_COUNTER (64)
#   ring          INSERT INTO log (…) VALUES (…), half on 10 keys    THREADS_RING (64)
#   rollup        INSERT INTO plays (…) VALUES (NOW(), …), two rollups (hour, day),
#                 half of the plays on one track                    THREADS_ROLLUP (32)
# With TRANSPORTS="tcp unix" (the default) every workload also runs with both proxies
# on Unix sockets at both ends (sysbench on the proxy's socket, the proxy on
# MariaDB's): the sidecar deployment, clients and server on the proxy's host.
# With VARIANT (serve flags; default "--sched-policy batch"; "--runtime per-core"
# compares the runtimes) a second
# heatsink runs with those flags (heatsink_v, and heatsink_unix_v on sockets), its own
# process, legs of both in every round; VARIANT="" leaves it out. VARIANT_BIN runs the
# variant from another binary (a build before or after a change), with VARIANT's flags.
# Per leg: statements (sysbench events, one statement each), statements/s, sysbench's
# latency (average and 95th percentile), the proxy's CPU time (user + system, and user
# alone, from /proc/PID/stat) over the leg, and with perf (PERF=1,
# default when `perf` works) the proxy's system calls and context switches over the
# leg, and its CPU migrations. Legs alternate (odd rounds haproxy first). Then, with PROFILE=1 (default), one
# extra heatsink leg per workload under `perf record`, its flat profile in the report.
#
#   scripts/bench-cpu.sh                     # about 6 minutes
#   ROUNDS=1 DURATION=5 PROFILE=0 scripts/bench-cpu.sh
#
# Environment: DURATION (10 s), ROUNDS (3), WORKLOADS, THREADS_*, TRANSPORTS, VARIANT, VARIANT_BIN, SKIP_BUILD=1,
# HEATSINK_BIN (default target/release/heatsink), OUT (bench/results/cpu.md).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/mariadb.sh
source "$SCRIPT_DIR/lib/mariadb.sh"
# shellcheck source=lib/merge_workloads.sh
source "$SCRIPT_DIR/lib/merge_workloads.sh"
cd "$HS_REPO_DIR"

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
WORKLOADS=${WORKLOADS:-"point_select counter ring rollup"}
THREADS_PS=${THREADS_PS:-16}
THREADS_COUNTER=${THREADS_COUNTER:-64}
THREADS_RING=${THREADS_RING:-64}
THREADS_ROLLUP=${THREADS_ROLLUP:-32}
PROFILE=${PROFILE:-1}
TRANSPORTS=${TRANSPORTS:-"tcp unix"}
VARIANT=${VARIANT-"--sched-policy batch"}
read -r -a VARIANT_ARGS <<<"$VARIANT"
OUT=${OUT:-bench/results/cpu.md}
TABLES=4
TABLE_SIZE=10000
export MARIADB_EXTRA_ARGS=${MARIADB_EXTRA_ARGS:---innodb-buffer-pool-size=512M}

hs_install_traps
[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink
HEATSINK_BIN=${HEATSINK_BIN:-$HS_REPO_DIR/target/release/heatsink}
export HEATSINK_BIN
VARIANT_BIN=${VARIANT_BIN:-$HEATSINK_BIN}
VARIANT_LABEL=$VARIANT
[[ $VARIANT_BIN == "$HEATSINK_BIN" ]] || VARIANT_LABEL+="${VARIANT:+ }from $VARIANT_BIN"
REV=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo " (uncommitted changes)")
PERF=${PERF:-$(perf stat -e raw_syscalls:sys_enter true >/dev/null 2>&1 && echo 1 || echo 0)}
[[ $PERF == 1 ]] || PROFILE=0

hs_tmpdir_into WORK cpu
RAW=$WORK/raw.tsv # round workload proxy events seconds cpu_us syscalls cswitches migrations user_us lat_avg_ms lat_p95_ms
: >"$RAW"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

mariadb_start
merge_workloads_schema "$SB_DB"
hs_log "sysbench prepare ($TABLES tables × $TABLE_SIZE rows)"
sysbench oltp_point_select --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$MARIADB_PORT" \
  --mysql-user="$SB_USER" --mysql-password="$SB_PASSWORD" --mysql-db="$SB_DB" \
  --tables=$TABLES --table-size=$TABLE_SIZE prepare >"$WORK/prepare.log" 2>&1 ||
  { cat "$WORK/prepare.log" >&2; hs_die "sysbench prepare failed"; }

hs_tmpdir_into RULES rules
merge_workloads_rules "$RULES/rules.toml"
"$HEATSINK_BIN" migrate --rules "$RULES" \
  --backend-url "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$MARIADB_PORT/$SB_DB" --apply \
  >"$WORK/migrate.log" 2>&1 || { cat "$WORK/migrate.log" >&2; hs_die "heatsink migrate failed"; }

HS_RULES_DIR=$RULES heatsink_start "$MARIADB_PORT"
HS_PID=$HEATSINK_PID HS_PORT=$HEATSINK_PORT
haproxy_start "$MARIADB_PORT"
PROXIES="haproxy heatsink"
if [[ -n $VARIANT_LABEL ]]; then
  HEATSINK_BIN=$VARIANT_BIN HS_RULES_DIR=$RULES heatsink_start "$MARIADB_PORT" "${VARIANT_ARGS[@]}"
  HSV_PID=$HEATSINK_PID HSV_PORT=$HEATSINK_PORT
  PROXIES+=" heatsink_v"
fi
if [[ $TRANSPORTS == *unix* ]]; then
  HS_UNIX_SOCK=$WORK/heatsink.sock
  HS_RULES_DIR=$RULES heatsink_start "unix:$MARIADB_SOCKET" --listen-unix "$HS_UNIX_SOCK"
  HSU_PID=$HEATSINK_PID
  haproxy_unix_start "$MARIADB_SOCKET"
  PROXIES+=" haproxy_unix heatsink_unix"
  if [[ -n $VARIANT_LABEL ]]; then
    HSV_UNIX_SOCK=$WORK/heatsink-v.sock
    HEATSINK_BIN=$VARIANT_BIN HS_RULES_DIR=$RULES heatsink_start "unix:$MARIADB_SOCKET" "${VARIANT_ARGS[@]}" --listen-unix "$HSV_UNIX_SOCK"
    HSUV_PID=$HEATSINK_PID
    PROXIES+=" heatsink_unix_v"
  fi
fi
HEATSINK_PID=$HS_PID HEATSINK_PORT=$HS_PORT

# One Lua workload per write statement (scripts/lib/merge_workloads.sh).
merge_workloads_lua "$WORK"

threads_of() {
  case $1 in
  point_select) echo "$THREADS_PS" ;;
  counter) echo "$THREADS_COUNTER" ;;
  ring) echo "$THREADS_RING" ;;
  rollup) echo "$THREADS_ROLLUP" ;;
  esac
}

# The proxy a leg measures: its pid and sysbench's connection options.
proxy_pid() {
  case $1 in
  haproxy) echo "$HAPROXY_PID" ;;
  heatsink) echo "$HEATSINK_PID" ;;
  heatsink_v) echo "$HSV_PID" ;;
  haproxy_unix) echo "$HAPROXY_UNIX_PID" ;;
  heatsink_unix) echo "$HSU_PID" ;;
  heatsink_unix_v) echo "$HSUV_PID" ;;
  esac
}
proxy_conn() {
  case $1 in
  haproxy) echo "--mysql-host=127.0.0.1 --mysql-port=$HAPROXY_PORT" ;;
  heatsink) echo "--mysql-host=127.0.0.1 --mysql-port=$HEATSINK_PORT" ;;
  haproxy_unix) echo "--mysql-socket=$HAPROXY_UNIX_SOCK" ;;
  heatsink_v) echo "--mysql-host=127.0.0.1 --mysql-port=$HSV_PORT" ;;
  heatsink_unix) echo "--mysql-socket=$HS_UNIX_SOCK" ;;
  heatsink_unix_v) echo "--mysql-socket=$HSV_UNIX_SOCK" ;;
  esac
}

# sysbench WORKLOAD PROXY SECONDS LOG
run_sysbench() {
  local w=$1 proxy=$2 secs=$3 log=$4 test conn
  if [[ $w == point_select ]]; then test=oltp_point_select; else test=$WORK/$w.lua; fi
  read -r -a conn <<<"$(proxy_conn "$proxy")"
  hs_run sysbench "$test" --db-driver=mysql "${conn[@]}" \
    --mysql-user="$SB_USER" --mysql-password="$SB_PASSWORD" --mysql-db="$SB_DB" \
    --tables=$TABLES --table-size=$TABLE_SIZE --threads="$(threads_of "$w")" --time="$secs" \
    --report-interval=0 run >"$log" 2>&1
}

# leg ROUND WORKLOAD PROXY -> a line in $RAW
leg() {
  local round=$1 w=$2 proxy=$3 pid log c0 c1 u0 u1 perfout events secs lat avg p95 sc=0 cs=0 mig=0
  pid=$(proxy_pid "$proxy")
  log=$WORK/$w-$proxy-$round.log
  perfout=$WORK/$w-$proxy-$round.perf
  c0=$(hs_cpu_us "$pid") u0=$(hs_cpu_us "$pid" user)
  if [[ $PERF == 1 ]]; then
    perf stat -e raw_syscalls:sys_enter,context-switches,cpu-migrations -x, -o "$perfout" -p "$pid" &
    local perf_pid=$!
    hs_register_pid "$perf_pid"
  fi
  run_sysbench "$w" "$proxy" "$DURATION" "$log" || { tail -n 20 "$log" >&2; hs_die "sysbench $w through $proxy failed"; }
  c1=$(hs_cpu_us "$pid") u1=$(hs_cpu_us "$pid" user)
  if [[ $PERF == 1 ]]; then
    kill -INT "$perf_pid" 2>/dev/null || true
    wait "$perf_pid" 2>/dev/null || true
    hs_forget_pid "$perf_pid"
    sc=$(awk -F, '/raw_syscalls:sys_enter/ { print $1 }' "$perfout")
    cs=$(awk -F, '/context-switches/ { print $1 }' "$perfout")
    mig=$(awk -F, '/cpu-migrations/ { print $1 }' "$perfout")
  fi
  events=$(sed -n 's/^ *total number of events: *\([0-9]*\)/\1/p' "$log" | sed -n 1p)
  secs=$(sed -n 's/^ *total time: *\([0-9.]*\)s/\1/p' "$log" | sed -n 1p)
  avg=$(sed -n 's/^ *avg: *\([0-9.]*\)$/\1/p' "$log" | sed -n 1p)
  p95=$(sed -n 's/^ *95th percentile: *\([0-9.]*\)$/\1/p' "$log" | sed -n 1p)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$w" "$proxy" "$events" "$secs" "$((c1 - c0))" \
    "${sc:-0}" "${cs:-0}" "${mig:-0}" "$((u1 - u0))" "${avg:-0}" "${p95:-0}" >>"$RAW"
  hs_log "round $round $w $proxy: $events statements in ${secs}s, proxy CPU $(((c1 - c0) / (events > 0 ? events : 1))) µs per statement"
}

# Warm-up: every workload through both proxies, unrecorded.
for w in $WORKLOADS; do
  for proxy in $PROXIES; do
    run_sysbench "$w" "$proxy" 3 "$WORK/warmup.log" || { tail -n 20 "$WORK/warmup.log" >&2; hs_die "warm-up $w through $proxy failed"; }
  done
done

for ((round = 1; round <= ROUNDS; round++)); do
  for w in $WORKLOADS; do
    if ((round % 2)); then order=$PROXIES; else order=$(echo "$PROXIES" | tr ' ' '\n' | tac | tr '\n' ' '); fi
    for proxy in $order; do leg "$round" "$w" "$proxy"; done
  done
done

# Profiles: one more heatsink leg per workload under perf record.
PROFILES=$WORK/profiles.txt
: >"$PROFILES"
if [[ $PROFILE == 1 ]]; then
  for w in $WORKLOADS; do
    perf record -F 499 -g -p "$HEATSINK_PID" -o "$WORK/$w.data" >"$WORK/$w.record.log" 2>&1 &
    rec=$!
    hs_register_pid "$rec"
    run_sysbench "$w" heatsink "$DURATION" "$WORK/$w-profile.log" || true
    kill -INT "$rec" 2>/dev/null || true
    wait "$rec" 2>/dev/null || true
    hs_forget_pid "$rec"
    # The system calls of the same workload, counted per statement.
    perf trace -s -p "$HEATSINK_PID" -o "$WORK/$w.trace" >/dev/null 2>&1 &
    rec=$!
    hs_register_pid "$rec"
    run_sysbench "$w" heatsink "$DURATION" "$WORK/$w-trace.log" || true
    kill -INT "$rec" 2>/dev/null || true
    wait "$rec" 2>/dev/null || true
    hs_forget_pid "$rec"
    traced=$(sed -n 's/^ *total number of events: *\([0-9]*\)/\1/p' "$WORK/$w-trace.log" | sed -n 1p)
    {
      echo "### $w"
      echo
      echo "Flat profile (symbols above 1.5 %):"
      echo
      echo '```'
      perf report -i "$WORK/$w.data" --stdio --no-children --sort dso,symbol --percent-limit 1.5 2>/dev/null |
        grep -E '^ +[0-9.]+%' | head -n 40 | sed -E 's/ +$//' | cut -c1-150
      echo '```'
      echo
      echo "Callers of the kernel's top symbols (where the scheduler and wake-up time comes from):"
      echo
      echo '```'
      perf report -i "$WORK/$w.data" --stdio --no-children --sort symbol -G --percent-limit 10 2>/dev/null |
        grep -vE '^#|^$' | grep -E '[0-9.]+%' | head -n 40 | sed -E 's/ +$//' | cut -c1-150
      echo '```'
      echo
      echo "System calls per statement (\`perf trace -s\`, one more leg of ${traced:-0} statements, under tracing):"
      echo
      awk -v n="${traced:-0}" '$2 ~ /^[0-9]+$/ && $1 ~ /^[a-z_0-9]+$/ && NF >= 7 { c[$1] += $2 }
        END { for (k in c) if (n > 0 && c[k] / n >= 0.01) printf "| %s | %.2f |\n", k, c[k] / n }' "$WORK/$w.trace" |
        sort -t'|' -k3 -rn | { echo "| system call | per statement |"; echo "|---|---:|"; cat; }
      echo
    } >>"$PROFILES"
  done
fi
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
HAPROXY_VERSION=$(haproxy -v 2>/dev/null | sed -n '1s/^HAProxy version \([^ ]*\).*/\1/p')
SB_VERSION=$(sysbench --version | awk '{print $2}')

B_REV=$REV B_VERSION=$MARIADB_VERSION B_HAPROXY=$HAPROXY_VERSION B_SYSBENCH=$SB_VERSION \
  B_LOAD_START=$load_start B_LOAD_END=$load_end B_DURATION=$DURATION B_ROUNDS=$ROUNDS \
  B_THREADS="point_select=$THREADS_PS counter=$THREADS_COUNTER ring=$THREADS_RING rollup=$THREADS_ROLLUP" \
  B_PERF=$PERF B_WORKLOADS=$WORKLOADS B_PROXIES=$PROXIES B_VARIANT=$VARIANT_LABEL python3 - "$RAW" "$PROFILES" "$OUT" <<'PY'
import datetime, os, statistics, sys
raw, profiles, out = sys.argv[1:4]
E = os.environ
rows = {}
for line in open(raw):
    r, w, p, ev, secs, cpu, sc, cs, mig, usr, avg, p95 = line.rstrip("\n").split("\t")
    num = lambda v: int(v) if v.isdigit() else 0
    rows[(int(r), w, p)] = dict(events=int(ev or 0), secs=float(secs or 0), cpu=int(cpu), sc=num(sc), cs=num(cs), mig=num(mig),
                                usr=int(usr), avg=float(avg or 0), p95=float(p95 or 0))
rounds, workloads = int(E["B_ROUNDS"]), E["B_WORKLOADS"].split()
perf = E["B_PERF"] == "1"
def per(r, w, p, k):
    x = rows[(r, w, p)]
    return x[k] / max(x["events"], 1)
def lat(r, w, p, k):
    return rows[(r, w, p)][k]
def rate(r, w, p):
    x = rows[(r, w, p)]
    return x["events"] / max(x["secs"], 1e-9)
med = statistics.median
rr = range(1, rounds + 1)
L = [
    "# Proxy CPU per client statement: heatsink against haproxy",
    "",
    f"- date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; heatsink {E['B_REV']}; MariaDB {E['B_VERSION']}, HAProxy {E['B_HAPROXY']} (TCP mode), sysbench {E['B_SYSBENCH']}",
    f"- machine: {os.cpu_count()} cores, shared by sysbench, both proxies and the server; load average (1/5/15 min) at the start {E['B_LOAD_START']}, at the end {E['B_LOAD_END']}",
    f"- {rounds} rounds of {E['B_DURATION']} s per leg, haproxy and heatsink back to back (order alternating); threads: {E['B_THREADS']}",
    "- CPU: user + system time of the proxy process over the leg (`/proc/PID/stat`), divided by the statements sysbench completed (one statement per event); user: the user time alone; latency: sysbench's average and 95th percentile per statement",
    "- haproxy forwards to the plain tables; heatsink runs the default rules (counter 16 slots, ring size 5, two rollups; group commit on), so its statements are merged",
    "",
    "## CPU per statement, heatsink / haproxy",
    "",
    "| workload | haproxy µs | heatsink µs | **ratio** (median of rounds) | per round | user µs (haproxy, heatsink) | throughput heatsink / haproxy | latency avg ms (haproxy, heatsink) | latency p95 ms (haproxy, heatsink) |" + (" syscalls per statement (haproxy, heatsink) | context switches per statement (haproxy, heatsink) |" if perf else ""),
    "|---|---:|---:|---:|---|---|---:|---|---|" + ("---|---|" if perf else ""),
]
def pair(w, a, b, f):
    return f"{f(med(per(r, w, a, 'usr') for r in rr))}, {f(med(per(r, w, b, 'usr') for r in rr))}"
def lats(w, a, b, k):
    return f"{med(lat(r, w, a, k) for r in rr):.2f}, {med(lat(r, w, b, k) for r in rr):.2f}"
for w in workloads:
    ratios = [per(r, w, "heatsink", "cpu") / max(per(r, w, "haproxy", "cpu"), 1e-9) for r in rr]
    tput = med(rate(r, w, "heatsink") / max(rate(r, w, "haproxy"), 1e-9) for r in rr)
    line = (f"| {w} | {med(per(r, w, 'haproxy', 'cpu') for r in rr):.1f} | {med(per(r, w, 'heatsink', 'cpu') for r in rr):.1f} |"
            f" **{med(ratios):.2f}** | {', '.join(f'{x:.2f}' for x in ratios)} | {pair(w, 'haproxy', 'heatsink', lambda v: f'{v:.1f}')} |"
            f" {tput:.2f} | {lats(w, 'haproxy', 'heatsink', 'avg')} | {lats(w, 'haproxy', 'heatsink', 'p95')} |")
    if perf:
        line += (f" {med(per(r, w, 'haproxy', 'sc') for r in rr):.2f}, {med(per(r, w, 'heatsink', 'sc') for r in rr):.2f} |"
                 f" {med(per(r, w, 'haproxy', 'cs') for r in rr):.2f}, {med(per(r, w, 'heatsink', 'cs') for r in rr):.2f} |")
    L.append(line)
proxies = E["B_PROXIES"].split()
if "heatsink_unix" in proxies:
    L += ["", "## Unix sockets at both ends (sysbench on the proxy's socket, the proxy on MariaDB's)", "",
          "| workload | haproxy_unix µs | heatsink_unix µs | heatsink_unix / haproxy_unix | heatsink_unix / haproxy (TCP) | heatsink_unix / heatsink (TCP) | throughput heatsink_unix / haproxy_unix |",
          "|---|---:|---:|---:|---:|---:|---:|"]
    for w in workloads:
        def m(p): return med(per(r, w, p, "cpu") for r in rr)
        def ratio(a, b): return med(per(r, w, a, "cpu") / max(per(r, w, b, "cpu"), 1e-9) for r in rr)
        tput = med(rate(r, w, "heatsink_unix") / max(rate(r, w, "haproxy_unix"), 1e-9) for r in rr)
        L.append(f"| {w} | {m('haproxy_unix'):.1f} | {m('heatsink_unix'):.1f} | **{ratio('heatsink_unix', 'haproxy_unix'):.2f}** |"
                 f" **{ratio('heatsink_unix', 'haproxy'):.2f}** | {ratio('heatsink_unix', 'heatsink'):.2f} | {tput:.2f} |")
    L += ["", "Ratios are medians of per-round ratios (the legs of a round ran back to back)."]
vs = [(a, b) for a, b in [("heatsink_v", "heatsink"), ("heatsink_unix_v", "heatsink_unix")] if a in proxies]
if vs:
    L += ["", f"## heatsink `{E['B_VARIANT']}` (the variant) against heatsink with its defaults, same rounds", "",
          "| workload | transport | default µs | variant µs | **variant / default** CPU per statement | per round | user µs (default, variant) | variant / haproxy (same transport) | throughput variant / default | latency avg ms (default, variant) | latency p95 ms (default, variant) |"
          + (" context switches per statement (default, variant) | CPU migrations per statement (default, variant) |" if perf else ""),
          "|---|---|---:|---:|---:|---|---|---:|---:|---|---|" + ("---|---|" if perf else "")]
    for w in workloads:
        for a, b in vs:
            h = "haproxy_unix" if "unix" in a else "haproxy"
            ratios = [per(r, w, a, "cpu") / max(per(r, w, b, "cpu"), 1e-9) for r in rr]
            vs_h = med(per(r, w, a, "cpu") / max(per(r, w, h, "cpu"), 1e-9) for r in rr)
            tput = med(rate(r, w, a) / max(rate(r, w, b), 1e-9) for r in rr)
            line = (f"| {w} | {'unix' if 'unix' in a else 'tcp'} | {med(per(r, w, b, 'cpu') for r in rr):.1f} | {med(per(r, w, a, 'cpu') for r in rr):.1f} |"
                    f" **{med(ratios):.2f}** | {', '.join(f'{x:.2f}' for x in ratios)} | {pair(w, b, a, lambda v: f'{v:.1f}')} | {vs_h:.2f} | {tput:.2f} |"
                    f" {lats(w, b, a, 'avg')} | {lats(w, b, a, 'p95')} |")
            if perf:
                line += (f" {med(per(r, w, b, 'cs') for r in rr):.3f}, {med(per(r, w, a, 'cs') for r in rr):.3f} |"
                         f" {med(per(r, w, b, 'mig') for r in rr):.4f}, {med(per(r, w, a, 'mig') for r in rr):.4f} |")
            L.append(line)
L += ["", "## Raw numbers", "",
      "| round | workload | proxy | statements | statements/s | latency avg / p95 ms | proxy CPU ms | CPU µs per statement | user µs per statement | syscalls | context switches | CPU migrations |",
      "|---:|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
for r in rr:
    for w in workloads:
        for p in proxies:
            x = rows[(r, w, p)]
            L.append(f"| {r} | {w} | {p} | {x['events']:,} | {rate(r, w, p):,.0f} | {x['avg']:.2f} / {x['p95']:.2f} | {x['cpu'] / 1000:,.0f} | {per(r, w, p, 'cpu'):.1f} | {per(r, w, p, 'usr'):.1f} | {x['sc']:,} | {x['cs']:,} | {x['mig']:,} |")
prof = open(profiles).read().strip()
if prof:
    L += ["", "## Where heatsink's CPU goes (`perf record -g`, flat by symbol, one extra leg per workload)", "", prof]
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
