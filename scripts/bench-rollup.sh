#!/usr/bin/env bash
# Aggregate reads over an append-only log, in one run against one private MariaDB:
#   1. a `plays` log of ROWS rows (default 5000000) over the last two years, one hot
#      track (123) with HOT_ROWS plays (default 500000), the rest on 100,000 cold
#      tracks, 10 countries; filled with INSERT … SELECT FROM seq_1_to_N.
#   2. two [[rollup]] rules on it (plays_by_country_hour: hour, [track_id, country];
#      plays_by_country_day: day, [track_id, country]), created and backfilled by
#      `heatsink migrate --apply` (timed). The day rollup answers the reads, taking
#      the whole hours of the ragged edges from the hour rollup.
#   3. the 7-day and 30-day per-country reads of the hot track, directly and through
#      heatsink: median latency of the load generator at 1 connection for
#      READ_DURATION seconds (default 5), and the two answers compared.
#   4. inserts at CONNS connections (default 64), half on the hot track, legs
#      interleaved, DURATION seconds each (default 10), ROUNDS rounds (default 1,
#      order rotated, medians):
#        bare       the same table in database `bare`, no rules, no triggers, directly
#        bare_hs    the same through heatsink (no rule names that table: passthrough)
#        rollup_hs  the log with the two rollups, through heatsink (concurrent
#                   inserts merged: the rules' default coalesce)
#        rollup_hs1 the same through a second heatsink whose rules say
#                   coalesce = false (one insert, one statement)
#        rollup     (reference) the log with the two rollups, directly
#      for each rule `slots` setting in SLOTS (default "8"; e.g. SLOTS="8 64": every
#      later setting drops the rollups and their triggers and migrates again).
#   5. after each setting's insert legs: every rollup equals a GROUP BY over the log
#      (groups that differ, 0 expected).
# Writes bench/results/rollup.md (OUT). Quick check: ROWS=300000 HOT_ROWS=30000. A larger
# log: ROWS=20000000 HOT_ROWS=2000000 MARIADB_EXTRA_ARGS=--innodb-buffer-pool-size=10G
# OUT=bench/results/rollup-20m.md (about 25 minutes, most of it filling, migrating and checking).
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-5000000}
HOT_ROWS=${HOT_ROWS:-500000}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-1}
CONNS=${CONNS:-64}
READ_DURATION=${READ_DURATION:-5}
SLOTS=${SLOTS:-8}
OUT=${OUT:-bench/results/rollup.md}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
HEATSINK_BIN=${HEATSINK_BIN:-$TARGET_DIR/release/heatsink}
LOADGEN=${LOADGEN:-$TARGET_DIR/release/examples/loadgen}
export HEATSINK_BIN
# The log and its rollups fit in memory, as on a server sized for them.
MARIADB_EXTRA_ARGS=${MARIADB_EXTRA_ARGS:---innodb-buffer-pool-size=3G}
export MARIADB_EXTRA_ARGS
HOT=123

[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink --example loadgen
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
mariadb_start

LOG_DDL='CREATE TABLE plays (
  id BIGINT AUTO_INCREMENT PRIMARY KEY,
  created_at DATETIME DEFAULT NULL,
  track_id INT DEFAULT NULL,
  user_id INT DEFAULT NULL,
  referer TEXT,
  country VARCHAR(255) DEFAULT NULL,
  api_consumer_key VARCHAR(255) DEFAULT NULL,
  KEY (track_id),
  KEY (user_id),
  KEY (created_at)
) ENGINE=InnoDB'
for db in logs bare; do
  mariadb_root -e "CREATE DATABASE $db; USE $db; $LOG_DDL;"
done
COUNTRIES="'US', 'GB', 'DE', 'FR', 'BR', 'JP', 'IN', 'MX', 'ES', 'SE'"

# The log, in time order (an append-only log's ids grow with its times): row n of N
# is (N - n) * 2 years / N before now. Every STEP-th row is the hot track's.
STEP=$((ROWS / HOT_ROWS))
CHUNK=500000
fill_start=$(date +%s.%N)
for ((lo = 1; lo <= ROWS; lo += CHUNK)); do
  hi=$((lo + CHUNK - 1 < ROWS ? lo + CHUNK - 1 : ROWS))
  mariadb_root logs -e "
    INSERT INTO plays (created_at, track_id, user_id, referer, country, api_consumer_key)
    SELECT NOW() - INTERVAL FLOOR(($ROWS - seq) * 63072000 / $ROWS) SECOND,
           IF(seq % $STEP = 0, $HOT, 1000 + FLOOR(RAND() * 100000)),
           1 + FLOOR(RAND() * 1000000),
           IF(seq % 3 = 0, NULL, CONCAT('https://www.example.com/tracks/', seq % 997)),
           ELT(1 + FLOOR(RAND() * 10), $COUNTRIES),
           IF(seq % 4 = 0, CONCAT('key-', seq % 50), NULL)
    FROM seq_${lo}_to_${hi}"
done
fill_s=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$fill_start" "$(date +%s.%N)")
mariadb_root logs -e "ANALYZE TABLE plays" >/dev/null
read -r log_rows hot_rows <<<"$(mariadb_root -N logs -e "SELECT COUNT(*), SUM(track_id = $HOT) FROM plays")"
hs_log "log: $log_rows rows ($hot_rows on track $HOT) in ${fill_s}s"

url() { echo "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$1/$2"; }
rules=""
hs_tmpdir_into rules rules-rollup
write_rules() {
  cat >"$rules/rollup.toml" <<EOF
[[rollup]]
name = "plays_by_country_hour"
table = "logs.plays"
rollup_table = "logs.plays_by_country_hour"
time = "created_at"
bucket = "hour"
dimensions = ["track_id", "country"]
slots = $1
coalesce = $2

[[rollup]]
name = "plays_by_country_day"
table = "logs.plays"
rollup_table = "logs.plays_by_country_day"
time = "created_at"
bucket = "day"
dimensions = ["track_id", "country"]
slots = $1
coalesce = $2
EOF
}
# The same rules without group commit, for the second heatsink.
rules1=""
hs_tmpdir_into rules1 rules-rollup-unmerged
write_rules1() {
  local saved=$rules
  rules=$rules1
  write_rules "$1" false
  rules=$saved
}
drop_rollups() {
  local t
  for t in $(mariadb_root -N -e "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS
      WHERE EVENT_OBJECT_SCHEMA = 'logs' AND EVENT_OBJECT_TABLE = 'plays'"); do
    mariadb_root logs -e "DROP TRIGGER $t"
  done
  mariadb_root logs -e "DROP TABLE IF EXISTS plays_by_country_hour, plays_by_country_day"
}
# migrate SLOTS -> creates and backfills both rollups; sets migrate_s.
migrate() {
  local t0 t1
  write_rules "$1" true
  write_rules1 "$1"
  t0=$(date +%s.%N)
  "$HEATSINK_BIN" migrate --rules "$rules" --backend-url "$(url "$MARIADB_PORT" logs)" --apply >"$sqldir/migrate.log" 2>&1 ||
    { cat "$sqldir/migrate.log" >&2; hs_die "heatsink migrate --apply failed"; }
  t1=$(date +%s.%N)
  migrate_s=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$t1")
  hs_log "migrate --apply (slots $1): ${migrate_s}s, rollup rows: $(mariadb_root -N logs -e \
"SELECT (SELECT COUNT(*) FROM plays_by_country_hour), (SELECT COUNT(*) FROM plays_by_country_day)" | tr '\t' ' ')"
}

sqldir=""
hs_tmpdir_into sqldir sql
results=$(mktemp)
reads=$(mktemp)
checks=$(mktemp)
migrations=$(mktemp)
trap 'rm -f "$results" "$reads" "$checks" "$migrations"; hs_cleanup' EXIT

# loadgen URL LABEL ARGS... -> one JSON line on stdout
loadgen() {
  local u=$1 label=$2 f
  shift 2
  f=$(mktemp "$sqldir/out.XXXXXX")
  hs_run "$LOADGEN" --url "$u" --json --label "$label" "$@" >"$f"
  cat "$f"
}
jget() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# Inserts: half on the hot track, half on a random cold one, each country in turn,
# values as literals (as an application sends them; the merger takes literals,
# parameters and clock functions, not an ELT() that picks the country).
ins() { echo "INSERT INTO plays (created_at, track_id, user_id, country) VALUES (NOW(), $1, {rand:1:1000000}, $2)"; }
for c in ${COUNTRIES//,/ }; do
  ins "$HOT" "$c"
  ins '{rand:1000:100999}' "$c"
done >"$sqldir/insert.sql"

# Groups where a rollup and a GROUP BY over the log differ (same key: dimensions,
# hs_nulls, bucket), and the rollup's total.
check_rollup() {
  local t=$1 dims=$2 fmt=$3 nulls=$4 vals=$5
  mariadb_root -N logs -e "
    SET SESSION tmp_table_size = 2147483648, max_heap_table_size = 2147483648;
    SELECT COUNT(*) FROM (
      SELECT 1 FROM (
        SELECT $dims, hs_nulls, hs_bucket, hs_rows AS n FROM $t
        UNION ALL
        SELECT $vals, $nulls, IFNULL(CAST(DATE_FORMAT(created_at, '$fmt') AS DATETIME), '1000-01-01 00:00:00'), -1 FROM plays
      ) u GROUP BY $dims, hs_nulls, hs_bucket HAVING SUM(n) <> 0) d"
}
verify() {
  local slots=$1 h d total
  h=$(check_rollup plays_by_country_hour 'track_id, country' '%Y-%m-%d %H:00:00' \
    '(track_id IS NULL) | ((country IS NULL) << 1) | ((created_at IS NULL) << 31)' "IFNULL(track_id, 0), IFNULL(country, '')")
  d=$(check_rollup plays_by_country_day 'track_id, country' '%Y-%m-%d' \
    '(track_id IS NULL) | ((country IS NULL) << 1) | ((created_at IS NULL) << 31)' "IFNULL(track_id, 0), IFNULL(country, '')")
  total=$(mariadb_root -N logs -e "SELECT (SELECT COUNT(*) FROM plays), (SELECT SUM(hs_rows) FROM plays_by_country_hour), (SELECT SUM(hs_rows) FROM plays_by_country_day)" | tr '\t' ' ')
  printf '%s\t%s\t%s\t%s\n' "$slots" "$h" "$d" "$total" >>"$checks"
  hs_log "check (slots $slots): groups differing from the log: plays_by_country_hour $h, plays_by_country_day $d; rows log/hour/day: $total"
}

for slots in $SLOTS; do
  first=0
  [[ $slots == "${SLOTS%% *}" ]] && first=1
  ((first)) || {
    heatsink_stop
    hs_stop_pid "$HS1_PID"
    drop_rollups
  }
  migrate "$slots"
  printf '%s\t%s\n' "$slots" "$migrate_s" >>"$migrations"
  METRICS_PORT=$(hs_free_port)
  HS_RULES_DIR=$rules1 heatsink_start "$MARIADB_PORT"
  HS1_PORT=$HEATSINK_PORT HS1_PID=$HEATSINK_PID
  HS_RULES_DIR=$rules heatsink_start "$MARIADB_PORT" --metrics "127.0.0.1:$METRICS_PORT"

  if ((first)); then
    load_reads=$(cut -d' ' -f1-3 /proc/loadavg)
    # The minute of the hour: the log rows a read takes at its edges depend on it.
    read_minute=$(date +%M)
    # Reads: each statement directly and through heatsink, answers compared.
    for days in 7 30; do
      q="SELECT track_id, country, COUNT(*) AS total FROM plays WHERE track_id = $HOT AND created_at BETWEEN NOW() - INTERVAL $days DAY AND NOW() GROUP BY track_id, country"
      # One NOW() for both answers, so that the window cannot move between them.
      ts=$(date +%s)
      a=$(mariadb_root -N logs -e "SET timestamp = $ts; $q")
      b=$(mariadb_sb "$HEATSINK_PORT" -N -e "USE logs; SET timestamp = $ts; $q")
      same=no
      [[ $a == "$b" ]] && same=yes
      rows_in=$(awk '{ s += $3 } END { print s + 0 }' <<<"$a")
      hs_log "read ${days}d: $rows_in plays of track $HOT in $(wc -l <<<"$a") countries; heatsink's answer equal: $same"
      for leg in direct heatsink; do
        port=$MARIADB_PORT
        [[ $leg == heatsink ]] && port=$HEATSINK_PORT
        json=$(loadgen "$(url "$port" logs)" "$leg" -c 1 -d "$READ_DURATION" --sql "$q")
        printf '%s\t%s\t%s\t%s\t%s\n' "$days" "$leg" "$same" "$rows_in" "$json" >>"$reads"
        hs_log "read ${days}d $leg: p50 $(jget "$json" p50_us) us, $(jget "$json" ops) runs, errors $(jget "$json" errors)"
      done
    done
    # The floor of any read: a trivial statement, directly and through heatsink.
    for leg in direct heatsink; do
      port=$MARIADB_PORT
      [[ $leg == heatsink ]] && port=$HEATSINK_PORT
      json=$(loadgen "$(url "$port" logs)" "floor_$leg" -c 1 -d "$READ_DURATION" --sql "SELECT 1")
      printf '%s\t%s\t%s\t%s\t%s\n' 0 "$leg" yes 0 "$json" >>"$reads"
      hs_log "floor (SELECT 1) $leg: p50 $(jget "$json" p50_us) us"
    done
    # Were the reads answered from the rollups (rewritten), or sent to the log (fallback)?
    stats=$(curl -s "http://127.0.0.1:$METRICS_PORT/metrics" 2>/dev/null |
      grep -E '^heatsink_(rule_statements_total.*outcome="(rewritten|fallback|error)"|prelude_total)' || true)
  fi

  load_inserts=$(cut -d' ' -f1-3 /proc/loadavg)
  # Inserts, legs interleaved and rotated per round.
  for ((round = 1; round <= ROUNDS; round++)); do
    legs=(bare bare_hs rollup_hs rollup_hs1 rollup)
    for ((i = 0; i < ${#legs[@]}; i++)); do
      leg=${legs[$(((i + round - 1) % ${#legs[@]}))]}
      case $leg in
        bare) u=$(url "$MARIADB_PORT" bare) ;;
        bare_hs) u=$(url "$HEATSINK_PORT" bare) ;;
        rollup_hs) u=$(url "$HEATSINK_PORT" logs) ;;
        rollup_hs1) u=$(url "$HS1_PORT" logs) ;;
        rollup) u=$(url "$MARIADB_PORT" logs) ;;
      esac
      json=$(loadgen "$u" "$leg" -c "$CONNS" -d "$DURATION" --sql-file "$sqldir/insert.sql" --mix round-robin)
      printf '%s\t%s\t%s\t%s\n' "$slots" "$round" "$leg" "$json" >>"$results"
      hs_log "slots $slots round $round $leg: $(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%.0f inserts/s p95 %.0f us errors %d %s" % (j["ops_per_sec"], j["p95_us"], j["errors"], j["error_samples"][:1]))' "$json")"
    done
  done
  verify "$slots"
done

python3 - "$results" "$reads" "$checks" "$migrations" "$OUT" "$DURATION" "$ROUNDS" "$MARIADB_VERSION" \
  "$log_rows" "$hot_rows" "$fill_s" "$CONNS" "$READ_DURATION" "$MARIADB_EXTRA_ARGS" "$stats" \
  "$load_reads" "$load_inserts" "$read_minute" <<'PY'
import json, statistics, sys, datetime, os, subprocess
(res_p, reads_p, checks_p, mig_p, out, duration, rounds, version, log_rows, hot_rows, fill_s,
 conns, read_d, extra, stats, load_reads, load_inserts, read_minute) = sys.argv[1:19]
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
load = open("/proc/loadavg").read().split()[:3]
reads = {}
for line in open(reads_p):
    days, leg, same, rows_in, js = line.rstrip("\n").split("\t", 4)
    reads[(int(days), leg)] = dict(json.loads(js), same=same, rows_in=int(rows_in))
ins = {}
for line in open(res_p):
    slots, rnd, leg, js = line.rstrip("\n").split("\t", 3)
    ins.setdefault((int(slots), leg), []).append(json.loads(js))
checks = [l.rstrip("\n").split("\t") for l in open(checks_p)]
migs = [l.split() for l in open(mig_p)]
def med(slots, leg, key="ops_per_sec"):
    return statistics.median(j[key] for j in ins[(slots, leg)])
slot_settings = sorted({s for s, _ in ins}, key=[int(m[0]) for m in migs].index)
lines = [
    "# Aggregate reads over an append-only log: heatsink's rollup rule",
    "",
    f"- date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, heatsink {rev}; load average before the reads {load_reads},"
    f" before the (first) insert legs {load_inserts}, at the end {' '.join(load)}",
    f"- machine: {os.cpu_count()} cores; MariaDB {version} (`{extra}`); client, proxy and server share the machine",
    f"- log `plays` (the application's table: `KEY (track_id)`, `KEY (user_id)`, `KEY (created_at)`): {int(log_rows):,} rows"
    f" filled in {fill_s} s by `INSERT … SELECT … FROM seq_1_to_N`, in time order (ids grow with `created_at`), evenly over"
    f" the last 730 days; track 123 has {int(hot_rows):,} plays (every {int(log_rows) // int(hot_rows)}th row), the others on"
    " 100,000 cold tracks; 10 countries at random",
    "- rules: `plays_by_country_hour` (bucket hour) and `plays_by_country_day` (bucket day), both with dimensions"
    " [track_id, country]; the day rollup answers the reads and takes the whole hours of their ragged edges from the hour"
    " rollup, the log only the partial hours; created by `heatsink migrate --apply` after the log was filled (triggers + backfill of both): "
    + ", ".join(f"{m[1]} s with `slots = {m[0]}`" for m in migs),
    "",
    "## Reads: the hot track per country, 7 and 30 days",
    "",
    "`SELECT track_id, country, COUNT(*) AS total FROM plays WHERE track_id = 123 AND created_at BETWEEN NOW() - INTERVAL"
    " n DAY AND NOW() GROUP BY track_id, country`, text protocol, the load generator at 1 connection for"
    f" {read_d} s per leg (direct and through heatsink, one after the other); latency per statement."
    " Through heatsink a read runs in two steps (`SELECT` of its bounds, then the read with literal boundaries);"
    f" the reads started at minute {read_minute} of the hour (the log rows read at the lower edge grow with the"
    " distance to the nearest hour, up to 30 minutes' worth).",
    "",
    "| window | plays in window | answers equal | direct p50 µs | heatsink p50 µs | **direct / heatsink (p50)** | direct runs | heatsink runs |",
    "|---|---:|---|---:|---:|---:|---:|---:|",
]
for days in (7, 30):
    d, h = reads[(days, "direct")], reads[(days, "heatsink")]
    lines.append(f"| {days} days | {d['rows_in']:,} | {d['same']} | {d['p50_us']:,.0f} | {h['p50_us']:,.0f} |"
                 f" **{d['p50_us'] / h['p50_us']:.1f}** | {d['ops']} | {h['ops']} |")
fd, fh = reads[(0, "direct")], reads[(0, "heatsink")]
lines += [
    "",
    f"The floor of any read, `SELECT 1` at 1 connection: p50 {fd['p50_us']:,.0f} µs directly,"
    f" {fh['p50_us']:,.0f} µs through heatsink.",
    "",
    "Target: ≥ 100 × (direct / heatsink) for both windows.",
    "",
    "| window | leg | p50 µs | p95 µs | p99 µs | max µs | errors |",
    "|---|---|---:|---:|---:|---:|---:|",
]
for days in (7, 30):
    for leg in ("direct", "heatsink"):
        j = reads[(days, leg)]
        lines.append(f"| {days} days | {leg} | {j['p50_us']:,.0f} | {j['p95_us']:,.0f} | {j['p99_us']:,.0f} | {j['max_us']:,.0f} | {j['errors']} |")
lines += [
    "",
    f"## Inserts at {conns} connections",
    "",
    "`INSERT INTO plays (created_at, track_id, user_id, country) VALUES (NOW(), t, {rand:1:1000000}, 'US')`"
    " (each of the 10 countries in turn), t = 123 for half of the inserts, a random cold track for the other half;"
    f" each leg {duration} s, {rounds} round(s) interleaved (order rotated), medians; autocommit.",
    "",
    "- bare: the same table in database `bare`, no rules, no triggers, directly",
    "- bare_hs: the same through heatsink (no rule names `bare.plays`: passthrough), the same hop as rollup_hs",
    "- rollup_hs: the log with the two rollups (their triggers), through heatsink; concurrent inserts merged into"
    " multi-row inserts (the rules' default `coalesce`)",
    "- rollup_hs1: the same through a second heatsink whose rules say `coalesce = false`: one insert, one statement",
    "- rollup: (reference) the log with the two rollups, directly",
    "",
    "| slots | **rollup_hs / bare_hs** | per round | **rollup_hs / bare** | per round | rollup_hs1 / bare_hs (unmerged) | rollup / bare (the triggers alone) | bare_hs / bare (the hop) |",
    "|---:|---:|---|---:|---|---:|---:|---:|",
]
def rounds_of(s, num, den):
    return ", ".join(f"{a['ops_per_sec'] / b['ops_per_sec']:.2f}" for a, b in zip(ins[(s, num)], ins[(s, den)]))
for s in slot_settings:
    b, bh, rh, rh1, r = (med(s, l) for l in ("bare", "bare_hs", "rollup_hs", "rollup_hs1", "rollup"))
    lines.append(f"| {s} | **{rh / bh:.2f}** | {rounds_of(s, 'rollup_hs', 'bare_hs')} | **{rh / b:.2f}** |"
                 f" {rounds_of(s, 'rollup_hs', 'bare')} | {rh1 / bh:.2f} | {r / b:.2f} | {bh / b:.2f} |")
lines += [
    "",
    "Target: rollup through heatsink ≥ 0.7 × the bare log without rules (like for like: both through heatsink; the"
    " second column sets it against the bare log sent directly).",
    "",
    "| slots | leg | inserts/s | p50 µs | p95 µs | p99 µs | errors |",
    "|---:|---|---:|---:|---:|---:|---:|",
]
samples = {}
for s in slot_settings:
    for leg in ("bare", "bare_hs", "rollup_hs", "rollup_hs1", "rollup"):
        lines.append(f"| {s} | {leg} | {med(s, leg):,.0f} | {med(s, leg, 'p50_us'):,.0f} | {med(s, leg, 'p95_us'):,.0f} |"
                     f" {med(s, leg, 'p99_us'):,.0f} | {sum(j['errors'] for j in ins[(s, leg)])} |")
        for j in ins[(s, leg)]:
            for e in j["error_samples"]:
                samples.setdefault(leg, set()).add(e)
if samples:
    lines += ["", "Error samples:", ""]
    for leg, es in samples.items():
        for e in sorted(es)[:3]:
            lines.append(f"- {leg}: `{e}`")
lines += [
    "",
    "## Rollups against the log after the insert legs",
    "",
    "Groups (dimensions, NULL bits, bucket) where `SUM(hs_rows)` differs from a `GROUP BY` over the log: 0 expected.",
    "",
    "| slots | plays_by_country_hour | plays_by_country_day | log rows | Σ hs_rows, hour | Σ hs_rows, day |",
    "|---:|---:|---:|---:|---:|---:|",
]
for s, h, d, tot in checks:
    a, b, c = (int(x) for x in tot.split())
    lines.append(f"| {s} | {h} | {d} | {a:,} | {b:,} | {c:,} |")
lines += ["", "Reads the rules answered (`rewritten`: from the rollups) or sent to the log (`fallback`), heatsink's"
          " metrics after the read legs:", "", "```", stats.strip(), "```"]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
# Exit status: every rollup matched the log, every read answered the same.
awk -F'\t' '$2 != 0 || $3 != 0 { bad = 1 } END { exit bad }' "$checks"
! grep -qP '^\d+\t\w+\tno\t' "$reads"
