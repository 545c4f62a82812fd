#!/usr/bin/env bash
# What the proxy's session state tracking costs the server. heatsink turns on
# `session_track_system_variables = '*'` and `session_track_state_change = ON` on
# every backend connection when a rule may merge writes (src/relay/state.rs); this
# measures that setting alone, without any proxy: sysbench (32 threads) inserts
# single rows into the bare log of bench-sysbench.sh directly, at a fixed pace (RATE
# events/s, below what the server takes, so that both legs do the same work per
# second), once with tracking as the server's default and once with the proxy's
# setting made in each connection's thread_init. The figure is the server's CPU time
# (/proc/PID/stat) over the leg divided by the events.
#
#   scripts/bench-tracking.sh        # about 90 s
#
# Environment: ROUNDS (4), DURATION (10), RATE (5000), OUT (bench/results/tracking.md).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/mariadb.sh
source "$SCRIPT_DIR/lib/mariadb.sh"
# shellcheck source=lib/merge_workloads.sh
source "$SCRIPT_DIR/lib/merge_workloads.sh"
hs_install_traps

ROUNDS=${ROUNDS:-4}
DURATION=${DURATION:-10}
RATE=${RATE:-5000}
OUT=${OUT:-$HS_REPO_DIR/bench/results/tracking.md}

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M')
mariadb_start
merge_workloads_schema "$SB_DB"
hs_tmpdir_into WORK tracking
for mode in default tracked; do
  setup=""
  if [[ $mode == tracked ]]; then
    setup="con:query(\"SET SESSION session_track_system_variables = '*', session_track_state_change = ON\")"
  fi
  cat >"$WORK/$mode.lua" <<LUA
function thread_init()
  drv = sysbench.sql.driver()
  con = drv:connect()
  $setup
end
function event()
  con:query(string.format("INSERT INTO plays (created_at, track_id, user_id, country) VALUES (NOW(), %d, %d, 'US')",
    sysbench.rand.uniform(1, 2) == 1 and 123 or sysbench.rand.uniform(1000, 100999), sysbench.rand.uniform(1, 1000000)))
end
function thread_done()
  con:disconnect()
end
LUA
done

RAW=$WORK/raw.tsv
: >"$RAW"
for ((round = 1; round <= ROUNDS; round++)); do
  # The order alternates: every other round the tracked leg runs first.
  legs=(default tracked)
  ((round % 2 == 0)) && legs=(tracked default)
  for mode in "${legs[@]}"; do
    s0=$(hs_cpu_us "$MARIADB_PID")
    events=$(sysbench "$WORK/$mode.lua" --db-driver=mysql --mysql-host=127.0.0.1 \
      --mysql-port="$MARIADB_PORT" --mysql-user="$SB_USER" --mysql-password="$SB_PASSWORD" \
      --mysql-db="$SB_DB" --threads=32 --time="$DURATION" --rate="$RATE" run |
      awk '/total number of events/ { print $NF }')
    s1=$(hs_cpu_us "$MARIADB_PID")
    printf '%s\t%s\t%s\t%s\n' "$round" "$mode" "$events" "$(((s1 - s0) / events))" >>"$RAW"
  done
  hs_log "round $round: $(awk -F'\t' -v r="$round" '$1 == r { printf "%s %s µs  ", $2, $4 }' "$RAW")"
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

B_DATE="$started–$(date -u +%H:%M) UTC" B_VERSION=$MARIADB_VERSION \
  B_LOAD="$load_start / $load_end" B_ROUNDS=$ROUNDS B_DURATION=$DURATION B_RATE=$RATE \
  python3 - "$RAW" >"$OUT" <<'PY'
import os, statistics, sys
e = os.environ
legs = {}
for line in open(sys.argv[1]):
    rnd, mode, events, us = line.split('\t')
    legs.setdefault(mode, {})[int(rnd)] = (int(events), int(us))
d, t = legs['default'], legs['tracked']
print("# What session state tracking costs the server\n")
print(f"- date: {e['B_DATE']}; MariaDB {e['B_VERSION']}; sysbench 1.0.20, 32 threads, single-row inserts into the bare log, directly")
print(f"- load average (1/5/15 min) at the start / end: {e['B_LOAD']}")
print(f"- {e['B_ROUNDS']} rounds of {e['B_DURATION']} s per leg at {e['B_RATE']} inserts/s (`--rate`), legs alternating in order")
print("- tracked: `SET SESSION session_track_system_variables = '*', session_track_state_change = ON` in each connection, as heatsink sets it on its backend connections")
print("- figure: mariadbd CPU time over the leg (/proc/PID/stat) / inserts, µs\n")
print("| leg | µs per insert (median) | per round | inserts per round |")
print("|---|---:|---|---|")
for name, v in (('server default', d), ('tracked', t)):
    print(f"| {name} | **{statistics.median(x[1] for x in v.values()):.0f}** | "
          f"{', '.join(str(v[r][1]) for r in sorted(v))} | {', '.join(str(v[r][0]) for r in sorted(v))} |")
ratio = statistics.median(t[r][1] / d[r][1] for r in t if r in d)
print(f"\ntracked / default, median of per-round ratios: **{ratio:.2f}** "
      f"(per round {', '.join(f'{t[r][1] / d[r][1]:.2f}' for r in sorted(t) if r in d)})")
PY
hs_log "wrote $OUT"
