#!/usr/bin/env bash
# The write kinds' throughput goals measured with sysbench (its Lua client costs CPU
# as real application drivers do), each kind through heatsink with its rule as a DBA
# writes it (group commit on by default) against what the application does without
# heatsink, sent directly to the same private MariaDB, in the same run:
#
#   counter  UPDATE hits SET cnt = cnt + 1 WHERE slug = 'hot'          THREADS_COUNTER (64)
#            direct: the single hot row;  heatsink: counter rule, 16 slots
#   ring     INSERT INTO log (uid, …) VALUES (…), half on 10 hot keys   THREADS_RING (64)
#            direct: append, and every 10th event the per-key purge down to the
#            newest 5 rows (bench-ring.sh's statement);  heatsink: ring rule size 5
#            (no purge: the ring keeps 5 per key)
#   rollup   INSERT INTO plays (…) VALUES (NOW(), …), half on one track THREADS_ROLLUP (32)
#            direct: the bare log (no rollups, no triggers);  heatsink: the log with
#            two rollups (hour and day per track and country, 8 slots)
# Reference legs: rollup_trg (the log with the rollups' triggers, directly),
# rollup_hop (the bare log through heatsink: the hop alone), rollup_haproxy (the bare
# log through haproxy in TCP mode: what any relay's hop costs on this machine).
# Ceiling legs (<workload>_null): the heatsink leg's script against a server that
# answers every statement with OK at once, no database behind it
# (examples/null_server.rs, on the runtime heatsink uses): sysbench's own cost and
# one answer per statement, nothing else. No proxy that answers each client
# statement serves more statements per second than that on the same machine, so the
# ceiling / direct ratio bounds what any relay can reach against each goal.
# TRANSPORT=unix (a sidecar deployment): every leg over Unix sockets, sysbench on
# the server's socket (direct), heatsink's (`--listen-unix`, itself on the server's
# socket with `--backend unix:PATH`) or haproxy's (`bind unix@`, `server unix@`).
# RUNTIMES="shared per-core": every heatsink leg once per serve runtime (`--runtime`;
# the per-core legs' names end in _pc), each runtime its own proxy.
# BASE_BIN=PATH: every heatsink leg also through a second heatsink built from another
# tree (shared runtime; the legs' names end in _base), in the same rounds, and the
# report compares this build with that one.
# Legs alternate (order reversed every other round); ratios are medians of the
# per-round ratios. After the legs: the counter equals the increments heatsink
# acknowledged, every rollup equals a GROUP BY over its log, no ring key holds more
# than 5 rows.
#
#   scripts/bench-sysbench.sh                       # about 5 minutes
#   ROUNDS=1 DURATION=5 scripts/bench-sysbench.sh
#
# Environment: DURATION (15 s), ROUNDS (3), WORKLOADS, THREADS_*, TRANSPORT (tcp),
# RUNTIMES (shared), BASE_BIN, SKIP_BUILD=1, HEATSINK_BIN, OUT (bench/results/sysbench.md).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/mariadb.sh
source "$SCRIPT_DIR/lib/mariadb.sh"
# shellcheck source=lib/merge_workloads.sh
source "$SCRIPT_DIR/lib/merge_workloads.sh"
cd "$HS_REPO_DIR"

DURATION=${DURATION:-15}
ROUNDS=${ROUNDS:-3}
WORKLOADS=${WORKLOADS:-"counter ring rollup"}
THREADS_COUNTER=${THREADS_COUNTER:-64}
THREADS_RING=${THREADS_RING:-64}
THREADS_ROLLUP=${THREADS_ROLLUP:-32}
TRANSPORT=${TRANSPORT:-tcp}
RUNTIMES=${RUNTIMES:-shared}
BASE_BIN=${BASE_BIN:-}
[[ -z $BASE_BIN ]] || { [[ -x $BASE_BIN ]] || hs_die "BASE_BIN $BASE_BIN is not executable"; RUNTIMES+=" base"; }
OUT=${OUT:-bench/results/sysbench.md}
[[ $TRANSPORT == tcp || $TRANSPORT == unix ]] || hs_die "TRANSPORT must be tcp or unix, not $TRANSPORT"
export MARIADB_EXTRA_ARGS=${MARIADB_EXTRA_ARGS:---innodb-buffer-pool-size=512M}

hs_install_traps
[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink --example null_server
HEATSINK_BIN=${HEATSINK_BIN:-$HS_REPO_DIR/target/release/heatsink}
export HEATSINK_BIN
NULL_BIN=${NULL_BIN:-$HS_REPO_DIR/target/release/examples/null_server}
[[ -x $NULL_BIN ]] || hs_die "null server not found at $NULL_BIN (cargo build --release --example null_server)"
REV=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo " (uncommitted changes)")
BASE_REV=${BASE_REV:-$BASE_BIN}

hs_tmpdir_into WORK sysbench
RAW=$WORK/raw.tsv # round leg events seconds errors client_us server_us proxy_us
: >"$RAW"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

mariadb_start
# `plain`: the application's tables as they are (direct legs and the hop);
# $SB_DB: the same tables under heatsink's rules.
mariadb_root -e "CREATE DATABASE plain"
merge_workloads_schema plain
merge_workloads_schema "$SB_DB"
hs_tmpdir_into RULES rules
merge_workloads_rules "$RULES/rules.toml"
# The rules name their tables with the database, so `plain` stays unruled.
sed -i -E "s/^table = \"/table = \"$SB_DB./" "$RULES/rules.toml"
"$HEATSINK_BIN" migrate --rules "$RULES" \
  --backend-url "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$MARIADB_PORT/$SB_DB" --apply \
  >"$WORK/migrate.log" 2>&1 || { cat "$WORK/migrate.log" >&2; hs_die "heatsink migrate failed"; }
# One heatsink per runtime (HS_PORT and HS_SOCK by runtime); HEATSINK_PORT (the
# first one's, TCP) is where the checks read.
declare -A HS_PORT HS_SOCK HS_PID
for rt in $RUNTIMES; do
  bin=$HEATSINK_BIN runtime=$rt
  [[ $rt != base ]] || bin=$BASE_BIN runtime=shared
  if [[ $TRANSPORT == unix ]]; then
    HS_SOCK[$rt]=$WORK/heatsink-$rt.sock
    HEATSINK_BIN=$bin HS_RULES_DIR=$RULES heatsink_start "unix:$MARIADB_SOCKET" --runtime "$runtime" --listen-unix "${HS_SOCK[$rt]}"
  else
    HEATSINK_BIN=$bin HS_RULES_DIR=$RULES heatsink_start "$MARIADB_PORT" --runtime "$runtime"
  fi
  HS_PORT[$rt]=$HEATSINK_PORT HS_PID[$rt]=$HEATSINK_PID
done
HEATSINK_PORT=${HS_PORT[${RUNTIMES%% *}]}
if [[ $TRANSPORT == unix ]]; then haproxy_unix_start "$MARIADB_SOCKET"; else haproxy_start "$MARIADB_PORT"; fi
# The ceiling's server: TCP and, for TRANSPORT=unix, a socket.
NULL_PORT=$(hs_free_port) NULL_SOCK=$WORK/null.sock
null_args=(--listen "127.0.0.1:$NULL_PORT")
[[ $TRANSPORT != unix ]] || null_args+=(--unix "$NULL_SOCK")
setsid "$NULL_BIN" "${null_args[@]}" >"$WORK/null.log" 2>&1 &
NULL_PID=$!
hs_register_pid "$NULL_PID"
for ((i = 0; i < 100; i++)); do
  grep -q 'listening on' "$WORK/null.log" 2>/dev/null && break
  kill -0 "$NULL_PID" 2>/dev/null || { cat "$WORK/null.log" >&2; hs_die "null server exited during startup"; }
  sleep 0.1
done
grep -q 'listening on' "$WORK/null.log" || hs_die "null server did not listen within 10s"

# One Lua workload per write statement (scripts/lib/merge_workloads.sh).
merge_workloads_lua "$WORK"

# The legs of a workload: name, script, where, database; the heatsink legs once per
# runtime (names of the per-core ones end in _pc).
legs_of() {
  local rt sfx hs=""
  for rt in $RUNTIMES; do
    case $rt in per-core) sfx=_pc ;; base) sfx=_base ;; *) sfx="" ;; esac
    case $1 in
    counter) hs+=" counter_hs$sfx:counter:hs-$rt:$SB_DB" ;;
    ring) hs+=" ring_hs$sfx:ring:hs-$rt:$SB_DB" ;;
    rollup) hs+=" rollup_hs$sfx:rollup:hs-$rt:$SB_DB rollup_hop$sfx:rollup:hs-$rt:plain" ;;
    esac
  done
  case $1 in
  counter) echo "counter_direct:counter:direct:plain$hs counter_null:counter:null:plain" ;;
  ring) echo "ring_direct:ring_purge:direct:plain$hs ring_null:ring:null:plain" ;;
  rollup) echo "rollup_direct:rollup:direct:plain$hs rollup_trg:rollup:direct:$SB_DB rollup_haproxy:rollup:haproxy:plain rollup_null:rollup:null:plain" ;;
  esac
}
# sysbench's connection options for a leg's `where`.
conn_of() {
  case $TRANSPORT:$1 in
  tcp:direct) echo "--mysql-host=127.0.0.1 --mysql-port=$MARIADB_PORT" ;;
  tcp:haproxy) echo "--mysql-host=127.0.0.1 --mysql-port=$HAPROXY_PORT" ;;
  tcp:null) echo "--mysql-host=127.0.0.1 --mysql-port=$NULL_PORT" ;;
  unix:null) echo "--mysql-socket=$NULL_SOCK" ;;
  tcp:hs-*) echo "--mysql-host=127.0.0.1 --mysql-port=${HS_PORT[${1#hs-}]}" ;;
  unix:direct) echo "--mysql-socket=$MARIADB_SOCKET" ;;
  unix:haproxy) echo "--mysql-socket=$HAPROXY_UNIX_SOCK" ;;
  unix:hs-*) echo "--mysql-socket=${HS_SOCK[${1#hs-}]}" ;;
  esac
}
threads_of() {
  case $1 in
  counter) echo "$THREADS_COUNTER" ;;
  ring) echo "$THREADS_RING" ;;
  rollup) echo "$THREADS_ROLLUP" ;;
  esac
}

# The proxy process of a leg's `where`, if any.
proxy_pid_of() {
  case $1 in
  haproxy) if [[ $TRANSPORT == unix ]]; then echo "$HAPROXY_UNIX_PID"; else echo "$HAPROXY_PID"; fi ;;
  null) echo "$NULL_PID" ;;
  hs-*) echo "${HS_PID[${1#hs-}]}" ;;
  esac
}

# leg ROUND WORKLOAD SPEC SECONDS -> a line in $RAW (round 0: warm-up, not recorded).
# CPU time over the leg of each process: sysbench (the client; its own threads and
# nothing else), mariadbd, and the proxy when the leg has one.
leg() {
  local round=$1 w=$2 name script where db conn log events secs errors ppid s0 s1 p0=0 p1=0 client
  IFS=: read -r name script where db <<<"$3"
  read -r -a conn <<<"$(conn_of "$where")"
  log=$WORK/$name-$round.log
  ppid=$(proxy_pid_of "$where")
  s0=$(hs_cpu_us "$MARIADB_PID")
  [[ -z $ppid ]] || p0=$(hs_cpu_us "$ppid")
  hs_run /usr/bin/time -f '%U %S' -o "$log.time" sysbench "$WORK/$script.lua" --db-driver=mysql "${conn[@]}" \
    --mysql-user="$SB_USER" --mysql-password="$SB_PASSWORD" --mysql-db="$db" \
    --mysql-ignore-errors=1213,1205 --threads="$(threads_of "$w")" --time="$4" \
    --report-interval=0 run >"$log" 2>&1 || { tail -n 20 "$log" >&2; hs_die "sysbench $name failed"; }
  s1=$(hs_cpu_us "$MARIADB_PID")
  [[ -z $ppid ]] || p1=$(hs_cpu_us "$ppid")
  client=$(awk '{ printf "%d", ($1 + $2) * 1000000 }' "$log.time")
  events=$(sed -n 's/^ *total number of events: *\([0-9]*\)/\1/p' "$log" | sed -n 1p)
  secs=$(sed -n 's/^ *total time: *\([0-9.]*\)s/\1/p' "$log" | sed -n 1p)
  errors=$(sed -n 's/^ *ignored errors: *\([0-9]*\).*/\1/p' "$log" | sed -n 1p)
  ((round == 0)) && return 0
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$name" "$events" "$secs" "${errors:-0}" \
    "$client" "$((s1 - s0))" "$((p1 - p0))" >>"$RAW"
  hs_log "round $round $name: $events events in ${secs}s ($((events * 10 / ${secs%.*}0))/s), ignored errors ${errors:-0}"
}

for w in $WORKLOADS; do
  for spec in $(legs_of "$w"); do leg 0 "$w" "$spec" 3; done
done
for ((round = 1; round <= ROUNDS; round++)); do
  for w in $WORKLOADS; do
    specs=$(legs_of "$w")
    ((round % 2)) || specs=$(echo "$specs" | tr ' ' '\n' | tac | tr '\n' ' ')
    for spec in $specs; do leg "$round" "$w" "$spec" "$DURATION"; done
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# Exactness after the legs.
CHECKS=$WORK/checks.txt
: >"$CHECKS"
if [[ $WORKLOADS == *counter* ]]; then
  acked=$(awk -F'\t' '$2 ~ /^counter_hs/ { s += $3 } END { print s + 0 }' "$RAW")
  warm=$(cat "$WORK"/counter_hs*-0.log | sed -n 's/^ *total number of events: *\([0-9]*\)/\1/p' | awk '{ s += $1 } END { print s + 0 }')
  got=$(mariadb_sb "$HEATSINK_PORT" -N -e "SELECT cnt FROM hits WHERE slug = 'hot'")
  echo "counter: heatsink acknowledged $((acked + warm)) increments (warm-up included); the counter reads $got through heatsink" >>"$CHECKS"
fi
if [[ $WORKLOADS == *ring* ]]; then
  over=$(mariadb_sb "$HEATSINK_PORT" -N -e "SELECT COUNT(*) FROM (SELECT uid FROM log GROUP BY uid HAVING COUNT(*) > 5) k")
  keys=$(mariadb_sb "$HEATSINK_PORT" -N -e "SELECT COUNT(DISTINCT uid) FROM log")
  echo "ring: $keys keys through heatsink, keys holding more than 5 rows: $over" >>"$CHECKS"
fi
if [[ $WORKLOADS == *rollup* ]]; then
  for t in plays_by_country_hour:'%Y-%m-%d %H:00:00' plays_by_country_day:'%Y-%m-%d'; do
    table=${t%%:*} fmt=${t#*:}
    diff=$(mariadb_root -N "$SB_DB" -e "
      SELECT COUNT(*) FROM (
        SELECT 1 FROM (
          SELECT track_id, country, hs_nulls, hs_bucket, hs_rows AS n FROM $table
          UNION ALL
          SELECT IFNULL(track_id, 0), IFNULL(country, ''),
                 (track_id IS NULL) | ((country IS NULL) << 1) | ((created_at IS NULL) << 31),
                 IFNULL(CAST(DATE_FORMAT(created_at, '$fmt') AS DATETIME), '1000-01-01 00:00:00'), -1 FROM plays
        ) u GROUP BY track_id, country, hs_nulls, hs_bucket HAVING SUM(n) <> 0) d")
    rows=$(mariadb_root -N "$SB_DB" -e "SELECT (SELECT COUNT(*) FROM plays), (SELECT SUM(hs_rows) FROM $table)" | tr '\t' '/')
    echo "rollup $table: groups differing from a GROUP BY over the log: $diff (log rows / Σ hs_rows: $rows)" >>"$CHECKS"
  done
fi
cat "$CHECKS" >&2
SB_VERSION=$(sysbench --version | awk '{print $2}')

B_BASE=$BASE_REV B_TRANSPORT=$TRANSPORT B_RUNTIMES=$RUNTIMES B_REV=$REV B_VERSION=$MARIADB_VERSION B_SYSBENCH=$SB_VERSION B_LOAD_START=$load_start \
  B_LOAD_END=$load_end B_DURATION=$DURATION B_ROUNDS=$ROUNDS B_WORKLOADS=$WORKLOADS \
  B_THREADS="counter=$THREADS_COUNTER ring=$THREADS_RING rollup=$THREADS_ROLLUP" \
  python3 - "$RAW" "$CHECKS" "$OUT" <<'PY'
import datetime, os, statistics, sys
raw, checks, out = sys.argv[1:4]
E = os.environ
rows = {}
for line in open(raw):
    r, name, ev, secs, err, client, server, proxy = line.rstrip("\n").split("\t")
    n = max(int(ev or 0), 1)
    rows[(int(r), name)] = dict(rate=int(ev or 0) / max(float(secs or 0), 1e-9), errors=int(err or 0),
                                client=int(client) / n, server=int(server) / n, proxy=int(proxy) / n)
rr = range(1, int(E["B_ROUNDS"]) + 1)
med = statistics.median
def ratio(a, b):
    per = [rows[(r, a)]["rate"] / max(rows[(r, b)]["rate"], 1e-9) for r in rr]
    return med(per), per
RT = {"shared": "", "per-core": "_pc", "base": "_base"}
runtimes = E["B_RUNTIMES"].split()
def rt_note(rt):
    if rt == "base":
        return f" (the base build, {E.get('B_BASE', '')})"
    return "" if [r for r in runtimes if r != "base"] == ["shared"] else f" ({rt} runtime)"
goals = [
    (w, f"{hs}{RT[rt]}", direct, goal, text + rt_note(rt))
    for rt in runtimes
    for w, hs, direct, goal, text in [
        ("counter", "counter_hs", "counter_direct", 6.0, "hot counter, default rule / the single row directly"),
        ("ring", "ring_hs", "ring_direct", 3.0, "ring, default rule / append + purge every 10th directly"),
        ("rollup", "rollup_hs", "rollup_direct", 0.7, "rollup log inserts through heatsink / the bare log directly"),
    ]
]
W = E["B_WORKLOADS"].split()
transport = {"tcp": "TCP (loopback) at every hop", "unix": "Unix sockets at every hop (sysbench on the server's, heatsink's or haproxy's socket; heatsink and haproxy on the server's)"}[E["B_TRANSPORT"]]
L = [
    "# The write kinds' goals with sysbench clients",
    "",
    f"- date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; heatsink {E['B_REV']}; MariaDB {E['B_VERSION']}; sysbench {E['B_SYSBENCH']} (Lua client, text protocol, autocommit)",
    f"- machine: {os.cpu_count()} cores shared by sysbench, heatsink and the server; load average (1/5/15 min) at the start {E['B_LOAD_START']}, at the end {E['B_LOAD_END']}",
    f"- {E['B_ROUNDS']} rounds of {E['B_DURATION']} s per leg, the legs of a workload back to back (order reversed every other round); threads {E['B_THREADS']}",
    f"- transport: {transport}; heatsink runtime(s): {', '.join(runtimes)}",
    "- rules as a DBA writes them (scripts/lib/merge_workloads.sh): counter 16 slots, ring size 5, two rollups (hour and day per track and country, 8 slots); group commit on by default",
    "",
    "| goal | **ratio** (median) | per round | goal |",
    "|---|---:|---|---:|",
]
for w, a, b, goal, text in goals:
    if w not in W:
        continue
    m, per = ratio(a, b)
    L.append(f"| {text} | **{m:.2f}** | {', '.join(f'{x:.2f}' for x in per)} | ≥ {goal:g} |")
ceil = [(w, f"{w}_null", f"{w}_direct", goal) for w, goal in [("counter", 6.0), ("ring", 3.0), ("rollup", 0.7)] if w in W]
if ceil:
    L += ["", "The ceiling: the same sysbench script against a server that answers every statement with OK at once, no database behind it (examples/null_server.rs). No relay that answers each client statement serves more than that on this machine.", "",
          "| workload | ceiling / direct (median) | per round | goal | heatsink / ceiling (median) |", "|---|---:|---|---:|---:|"]
    for w, n, d, goal in ceil:
        m, per = ratio(n, d)
        hs, _ = ratio(f"{w}_hs{RT[runtimes[0]]}", n)
        L.append(f"| {w} | **{m:.2f}** | {', '.join(f'{x:.2f}' for x in per)} | ≥ {goal:g} | {hs:.2f} |")
if "rollup" in W:
    L += ["", "Rollup references:", "",
          "| ratio | median | per round |", "|---|---:|---|"]
    refs = [("rollup_trg", "rollup_direct", "the log with the rollups' triggers, directly / the bare log directly"),
            ("rollup_haproxy", "rollup_direct", "the bare log through haproxy / directly (an L4 relay's hop)")]
    for rt in runtimes:
        sfx = RT[rt]
        refs += [(f"rollup_hop{sfx}", "rollup_direct", "the bare log through heatsink / directly (the hop)" + rt_note(rt)),
                 (f"rollup_hs{sfx}", f"rollup_hop{sfx}", "the rollup log through heatsink / the bare log through heatsink" + rt_note(rt))]
    for a, b, text in refs:
        m, per = ratio(a, b)
        L.append(f"| {text} | {m:.2f} | {', '.join(f'{x:.2f}' for x in per)} |")
if "base" in runtimes:
    L += ["", f"This build ({E['B_REV']}) against the base build ({E.get('B_BASE', '')}), both shared runtime, in the same rounds: events per second and the proxy's CPU per event, this build / the base:", "",
          "| leg | events/s, median | per round | proxy CPU per event, median | per round |", "|---|---:|---|---:|---|"]
    first = runtimes[0]
    for name in ["counter_hs", "ring_hs", "rollup_hs", "rollup_hop"]:
        a, b = name + RT[first], name + "_base"
        if (1, a) in rows and (1, b) in rows:
            m, per = ratio(a, b)
            cpu = [rows[(r, a)]["proxy"] / max(rows[(r, b)]["proxy"], 1e-9) for r in rr]
            L.append(f"| {name} | **{m:.2f}** | {', '.join(f'{x:.2f}' for x in per)} | {med(cpu):.2f} | {', '.join(f'{x:.2f}' for x in cpu)} |")
if "per-core" in runtimes and "shared" in runtimes:
    L += ["", "Per-core runtime against the shared one (events per second, same round):", "",
          "| leg | per-core / shared, median | per round |", "|---|---:|---|"]
    for name in ["counter_hs", "ring_hs", "rollup_hs", "rollup_hop"]:
        if (1, name) in rows and (1, name + "_pc") in rows:
            m, per = ratio(name + "_pc", name)
            L.append(f"| {name} | **{m:.2f}** | {', '.join(f'{x:.2f}' for x in per)} |")
L += ["", "## Where each event's CPU goes (µs per event, medians over rounds)", "",
      "CPU time of each process over the leg (sysbench from `time`, mariadbd and the proxy from `/proc/PID/stat`) divided by the events; for the `_null` legs the proxy column is the null server. On two saturated cores the events per second are about 2,000,000 / the total. Cores busy: the three processes' CPU time over the leg / its length (what is left of the machine's cores was idle, or went to other work).", "",
      "| leg | client (sysbench) | server (mariadbd) | proxy | total | cores busy |", "|---|---:|---:|---:|---:|---:|"]
for name in sorted({n for (_, n) in rows}):
    c, sv, p = (med(rows[(r, name)][k] for r in rr) for k in ("client", "server", "proxy"))
    busy = med((rows[(r, name)]["client"] + rows[(r, name)]["server"] + rows[(r, name)]["proxy"]) * rows[(r, name)]["rate"] / 1e6 for r in rr)
    L.append(f"| {name} | {c:.1f} | {sv:.1f} | {p:.1f} | {c + sv + p:.1f} | {busy:.2f} |")
L += ["", "## Exact after the legs", ""] + [f"- {l.strip()}" for l in open(checks) if l.strip()]
L += ["", "## Raw numbers (events per second; ignored errors are deadlocks and lock-wait timeouts sysbench retried past)", "",
      "| round | leg | events/s | ignored errors |", "|---:|---|---:|---:|"]
for (r, name), x in sorted(rows.items()):
    L.append(f"| {r} | {name} | {x['rate']:,.0f} | {x['errors']} |")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
