#!/usr/bin/env bash
# Group commit of pristine sessions, a baseline heatsink against the current one, in
# one run against one private MariaDB. Both proxies run side by side on the same
# rules, schema and load generator (this tree's); each leg CONNS connections
# (default 64), DURATION seconds (default 10), ROUNDS rounds (default 3; the order of
# the two binaries alternates per round, medians and per-round values reported):
#   counter  UPDATE hits SET cnt = cnt + 1 WHERE slug = 'hot' through a [[counter]] rule
#   ring     INSERT INTO log (…) through a [[ring]] rule (size 5, key uid; half of the
#            inserts on the 10 hot keys)
#   rollup   INSERT INTO plays (…) through two [[rollup]] rules (hour and day; half of
#            the inserts on the hot track), literal values as applications send them
# every rule as a DBA writes it (no coalesce key: group commit on by default). After
# every leg: the counter grew by exactly the acknowledged increments; the ring's
# sequences by exactly the acknowledged inserts; the log by exactly the acknowledged
# inserts. At the end: ring invariants (at most 5 rows per key, count = min(5, seq))
# and every rollup equal to a GROUP BY over the log.
# Then a mixed run with the current binary only, for each kind in MIX_KINDS: CONNS
# connections, of which MIX_PER_GROUP (default 4) in each of five groups first change
# their session state (--setup of the load generator) and the rest stay pristine:
#   time_zone   SET time_zone = '+00:00'          (tracked system variable)
#   sql_mode    SET sql_mode = ''                 (tracked system variable)
#   user_var    SELECT @x := 1                    (user variable)
#   lock_tables LOCK TABLES scratch WRITE; UNLOCK TABLES
#   temp_table  CREATE TEMPORARY TABLE tmp_scratch (a INT)
# reporting heatsink_merge_alone_total by reason and heatsink_coalesced_writes_total
# (deltas over the run) against the acknowledged writes.
#
# BASE_BIN (required): the baseline heatsink binary, e.g. a release build of 2c93375 in
# a worktree; CUR_BIN (default target/release/heatsink) the current one. A binary's
# commit is read from the checkout it was built in (BASE_REV / CUR_REV to override).
# Writes bench/results/merge-state.md (OUT).
#   BASE_BIN=/work/wt-base/target/release/heatsink ROUNDS=3 scripts/bench-merge-state.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
WARMUP=${WARMUP:-3}
KINDS=${KINDS:-"counter ring rollup"}
MIX_KINDS=${MIX_KINDS:-"counter ring rollup"}
MIX_PER_GROUP=${MIX_PER_GROUP:-4}
ROLLUP_ROWS=${ROLLUP_ROWS:-200000}
OUT=${OUT:-bench/results/merge-state.md}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
CUR_BIN=${CUR_BIN:-$TARGET_DIR/release/heatsink}
LOADGEN=${LOADGEN:-$TARGET_DIR/release/examples/loadgen}
MARIADB_EXTRA_ARGS=${MARIADB_EXTRA_ARGS:---innodb-buffer-pool-size=1G}
export MARIADB_EXTRA_ARGS
[[ -n ${BASE_BIN:-} && -x ${BASE_BIN:-} ]] || { echo "BASE_BIN must name the baseline heatsink binary" >&2; exit 2; }
((CONNS > 5 * MIX_PER_GROUP)) || { echo "CONNS must exceed 5 * MIX_PER_GROUP" >&2; exit 2; }

[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink --example loadgen
# The baseline's commit, when the binary sits in a checkout's target/release.
BASE_REV=${BASE_REV:-$(git -C "$(dirname "$BASE_BIN")/../.." rev-parse --short HEAD 2>/dev/null || echo unknown)}
CUR_REV=${CUR_REV:-$(git -C "$(dirname "$CUR_BIN")/../.." rev-parse --short HEAD 2>/dev/null || echo unknown)}
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
# shellcheck source=lib/merge_workloads.sh
source scripts/lib/merge_workloads.sh
hs_install_traps
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
# Other work on the shared machine: compiler processes running (nobody else's count).
builds() { ps -eo comm= | grep -cE '^(rustc|cc1|cc1plus|ld|cargo)$' || true; }
builds_start=$(builds)
mariadb_start
db=bench
mariadb_root -e "CREATE DATABASE $db"

# Schema: the counter's table, the ring's log, the rollups' log (as in bench-counter,
# bench-ring and bench-rollup), and a table the lock_tables group locks.
merge_workloads_schema "$db"
mariadb_root "$db" -e "CREATE TABLE scratch (a INT) ENGINE=InnoDB"
HOT_TRACK=123
COUNTRIES="'US', 'GB', 'DE', 'FR', 'BR', 'JP', 'IN', 'MX', 'ES', 'SE'"
# A log of ROLLUP_ROWS rows over the last 30 days, every 10th on the hot track.
mariadb_root "$db" -e "
  INSERT INTO plays (created_at, track_id, user_id, country)
  SELECT NOW() - INTERVAL FLOOR(($ROLLUP_ROWS - seq) * 2592000 / $ROLLUP_ROWS) SECOND,
         IF(seq % 10 = 0, $HOT_TRACK, 1000 + FLOOR(RAND() * 100000)),
         1 + FLOOR(RAND() * 1000000), ELT(1 + FLOOR(RAND() * 10), $COUNTRIES)
  FROM seq_1_to_$ROLLUP_ROWS"

rules=""
hs_tmpdir_into rules rules
merge_workloads_rules "$rules/rules.toml"
url() { echo "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$1/$db"; }
sqldir=""
hs_tmpdir_into sqldir sql
"$CUR_BIN" migrate --rules "$rules" --backend-url "$(url "$MARIADB_PORT")" --apply >"$sqldir/migrate.log" 2>&1 ||
  { cat "$sqldir/migrate.log" >&2; hs_die "heatsink migrate --apply failed"; }

BASE_METRICS=$(hs_free_port)
HEATSINK_BIN=$BASE_BIN HS_RULES_DIR=$rules heatsink_start "$MARIADB_PORT" --metrics "127.0.0.1:$BASE_METRICS"
BASE_PORT=$HEATSINK_PORT BASE_PID=$HEATSINK_PID
CUR_METRICS=$(hs_free_port)
HEATSINK_BIN=$CUR_BIN HS_RULES_DIR=$rules heatsink_start "$MARIADB_PORT" --metrics "127.0.0.1:$CUR_METRICS"
CUR_PORT=$HEATSINK_PORT CUR_PID=$HEATSINK_PID

echo "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'hot'" >"$sqldir/counter.sql"
{
  echo "INSERT INTO log (uid, visitor_uid, last_update) VALUES ({rand:1:10}, {rand:1:1000000}, NOW(6))"
  echo "INSERT INTO log (uid, visitor_uid, last_update) VALUES ({rand:11:1000}, {rand:1:1000000}, NOW(6))"
} >"$sqldir/ring.sql"
for c in ${COUNTRIES//,/ }; do
  echo "INSERT INTO plays (created_at, track_id, user_id, country) VALUES (NOW(), $HOT_TRACK, {rand:1:1000000}, $c)"
  echo "INSERT INTO plays (created_at, track_id, user_id, country) VALUES (NOW(), {rand:1000:100999}, {rand:1:1000000}, $c)"
done >"$sqldir/rollup.sql"

# The total that grows by one with every acknowledged write of a kind.
total() {
  case $1 in
    counter) mariadb_root -N "$db" -e "SELECT cnt + COALESCE((SELECT SUM(cnt) FROM hits_slots WHERE slug = 'hot'), 0) FROM hits WHERE slug = 'hot'" ;;
    ring) mariadb_root -N "$db" -e "SELECT COALESCE(SUM(seq), 0) FROM log_seq" ;;
    rollup) mariadb_root -N "$db" -e "SELECT COUNT(*) FROM plays" ;;
  esac
}
# The proxy counters of group commit, one `name value` per line.
metrics() {
  curl -s --max-time 5 "http://127.0.0.1:$1/metrics" |
    grep -E '^heatsink_(coalesced_|rollup_merged_rows_total|merge_alone_total)' |
    sed -E 's/^heatsink_merge_alone_total\{reason="([a-z_]+)"\}/alone_\1/; s/^heatsink_//' || true
}
# delta BEFORE AFTER -> JSON object of the counters that grew.
delta() {
  python3 -c 'import json, sys
def parse(t):
    return {k: float(v) for k, v in (l.split() for l in t.splitlines() if l.strip())}
a, b = parse(sys.argv[1]), parse(sys.argv[2])
print(json.dumps({k: int(v - a.get(k, 0)) for k, v in b.items() if v != a.get(k, 0)}))' "$1" "$2"
}
# CPU time (user + system) a process has used so far, in microseconds.
CLK_TCK=$(getconf CLK_TCK)
cpu_us() { awk -v t="$CLK_TCK" '{ printf "%d\n", ($14 + $15) * 1000000 / t }' "/proc/$1/stat"; }
jget() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
# loadgen KIND PORT LABEL ARGS... -> one JSON line on stdout
loadgen() {
  local kind=$1 port=$2 label=$3 f
  shift 3
  f=$(mktemp "$sqldir/out.XXXXXX")
  hs_run "$LOADGEN" --url "$(url "$port")" --sql-file "$sqldir/$kind.sql" --mix round-robin \
    --json --label "$label" "$@" >"$f"
  cat "$f"
}

results=$(mktemp)
mixed=$(mktemp)
trap 'rm -f "$results" "$mixed"; hs_cleanup' EXIT
check_failed=0
# leg KIND BIN ROUND -> one timed leg, its totals check, a line in $results.
leg() {
  local kind=$1 bin=$2 round=$3 port mport pid before after m0 m1 c0 c1 json ops grew ok=1
  if [[ $bin == base ]]; then port=$BASE_PORT mport=$BASE_METRICS pid=$BASE_PID; else port=$CUR_PORT mport=$CUR_METRICS pid=$CUR_PID; fi
  before=$(total "$kind")
  m0=$(metrics "$mport")
  c0=$(cpu_us "$pid")
  json=$(loadgen "$kind" "$port" "${kind}_$bin" -c "$CONNS" -d "$DURATION")
  c1=$(cpu_us "$pid")
  m1=$(metrics "$mport")
  m1+=$'\n'"proxy_cpu_us $((c1 - c0))"
  after=$(total "$kind")
  ops=$(jget "$json" ops)
  grew=$((after - before))
  if ((grew != ops)); then
    hs_log "MISMATCH: $kind $bin round $round: acknowledged $ops, total grew by $grew"
    check_failed=1 ok=0
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$kind" "$bin" "$ops" "$grew" "$ok" "$(delta "$m0" "$m1")" "$json" >>"$results"
  hs_log "round $round $kind $bin: $(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%.0f ops/s p95 %.0f us errors %d %s" % (j["ops_per_sec"], j["p95_us"], j["errors"], j["error_samples"][:1]))' "$json"), total grew $grew of $ops"
}

# Warm-up: every kind through both proxies once, not recorded (first inserts into
# fresh tables, the proxies' backend connections and metadata).
for kind in $KINDS; do
  for bin in base cur; do
    port=$BASE_PORT
    [[ $bin == cur ]] && port=$CUR_PORT
    loadgen "$kind" "$port" warmup -c "$CONNS" -d "$WARMUP" >/dev/null
  done
done

round_loads=()
for ((round = 1; round <= ROUNDS; round++)); do
  round_loads+=("$(cut -d' ' -f1-3 /proc/loadavg)")
  for kind in $KINDS; do
    # Odd rounds run the baseline first, even rounds the current binary first.
    if ((round % 2)); then order="base cur"; else order="cur base"; fi
    for bin in $order; do leg "$kind" "$bin" "$round"; done
  done
done

# Mixed run, current binary: one load generator per group, all at once.
GROUPS_SPEC=(
  "time_zone|SET time_zone = '+00:00'"
  "sql_mode|SET sql_mode = ''"
  "user_var|SELECT @x := 1"
  "lock_tables|LOCK TABLES scratch WRITE|UNLOCK TABLES"
  "temp_table|CREATE TEMPORARY TABLE tmp_scratch (a INT)"
)
pristine=$((CONNS - 5 * MIX_PER_GROUP))
load_mixed=$(cut -d' ' -f1-3 /proc/loadavg)
for kind in $MIX_KINDS; do
  before=$(total "$kind")
  m0=$(metrics "$CUR_METRICS")
  pids=() outs=() names=()
  f=$(mktemp "$sqldir/mix.XXXXXX")
  "$LOADGEN" --url "$(url "$CUR_PORT")" --sql-file "$sqldir/$kind.sql" --mix round-robin --json \
    --label pristine -c "$pristine" -d "$DURATION" >"$f" &
  pids+=($!) outs+=("$f") names+=(pristine)
  hs_register_pid "$!"
  for spec in "${GROUPS_SPEC[@]}"; do
    IFS='|' read -r -a parts <<<"$spec"
    setup=()
    for s in "${parts[@]:1}"; do setup+=(--setup "$s"); done
    f=$(mktemp "$sqldir/mix.XXXXXX")
    "$LOADGEN" --url "$(url "$CUR_PORT")" --sql-file "$sqldir/$kind.sql" --mix round-robin --json \
      --label "${parts[0]}" -c "$MIX_PER_GROUP" -d "$DURATION" "${setup[@]}" >"$f" &
    pids+=($!) outs+=("$f") names+=("${parts[0]}")
    hs_register_pid "$!"
  done
  rc=0
  for p in "${pids[@]}"; do
    wait "$p" || rc=$?
    hs_forget_pid "$p"
  done
  ((rc == 0)) || hs_die "a load generator of the mixed $kind run failed"
  m1=$(metrics "$CUR_METRICS")
  after=$(total "$kind")
  ops=0
  groups_json=""
  for i in "${!outs[@]}"; do
    o=$(cat "${outs[$i]}")
    ops=$((ops + $(jget "$o" ops)))
    groups_json+="${groups_json:+,}\"${names[$i]}\":$o"
  done
  grew=$((after - before))
  ok=1
  if ((grew != ops)); then
    hs_log "MISMATCH: mixed $kind: acknowledged $ops, total grew by $grew"
    check_failed=1 ok=0
  fi
  printf '%s\t%s\t%s\t%s\t%s\t{%s}\n' "$kind" "$ops" "$grew" "$ok" "$(delta "$m0" "$m1")" "$groups_json" >>"$mixed"
  hs_log "mixed $kind: $ops writes acknowledged, total grew $grew; $(delta "$m0" "$m1")"
done

# Invariants at the end: the ring, and every rollup against the log.
read -r ring_keys ring_over ring_mismatch ring_badslot <<<"$(mariadb_root -N "$db" -e "
  SELECT
    (SELECT COUNT(*) FROM log_seq),
    (SELECT COALESCE(SUM(n > 5), 0) FROM (SELECT uid, COUNT(*) n FROM log_ring GROUP BY uid) c),
    (SELECT COUNT(*) FROM log_seq s LEFT JOIN (SELECT uid, COUNT(*) n, MAX(seq) m FROM log_ring GROUP BY uid) c USING (uid)
       WHERE COALESCE(c.n, 0) <> LEAST(s.seq, 5) OR c.m <> s.seq),
    (SELECT COUNT(*) FROM log_ring WHERE slot <> seq % 5 OR slot > 4)")"
hs_log "ring: $ring_keys keys, over 5 rows: $ring_over, count/seq mismatches: $ring_mismatch, bad slots: $ring_badslot"
check_rollup() {
  local t=$1 fmt=$2
  mariadb_root -N "$db" -e "
    SET SESSION tmp_table_size = 2147483648, max_heap_table_size = 2147483648;
    SELECT COUNT(*) FROM (
      SELECT 1 FROM (
        SELECT track_id, country, hs_nulls, hs_bucket, hs_rows AS n FROM $t
        UNION ALL
        SELECT IFNULL(track_id, 0), IFNULL(country, ''),
               (track_id IS NULL) | ((country IS NULL) << 1) | ((created_at IS NULL) << 31),
               IFNULL(CAST(DATE_FORMAT(created_at, '$fmt') AS DATETIME), '1000-01-01 00:00:00'), -1 FROM plays
      ) u GROUP BY track_id, country, hs_nulls, hs_bucket HAVING SUM(n) <> 0) d"
}
rollup_hour_diff=$(check_rollup plays_by_country_hour '%Y-%m-%d %H:00:00')
rollup_day_diff=$(check_rollup plays_by_country_day '%Y-%m-%d')
hs_log "rollups: groups differing from the log: hour $rollup_hour_diff, day $rollup_day_diff"
if ((ring_over + ring_mismatch + ring_badslot + rollup_hour_diff + rollup_day_diff != 0)); then check_failed=1; fi
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
builds_end=$(builds)

B_DURATION=$DURATION B_ROUNDS=$ROUNDS B_CONNS=$CONNS B_WARMUP=$WARMUP B_VERSION=$MARIADB_VERSION \
  B_BASE_REV=$BASE_REV B_CUR_REV=$CUR_REV B_LOAD_START=$load_start B_LOAD_MIXED=$load_mixed \
  B_LOAD_END=$load_end B_ROUND_LOADS=$(IFS=';'; echo "${round_loads[*]}") B_CHECK_FAILED=$check_failed \
  B_RING="$ring_keys $ring_over $ring_mismatch $ring_badslot" B_ROLLUP_DIFF="$rollup_hour_diff $rollup_day_diff" \
  B_PER_GROUP=$MIX_PER_GROUP B_PRISTINE=$pristine B_BUILDS="$builds_start $builds_end" B_KINDS=$KINDS \
  B_ROLLUP_ROWS=$ROLLUP_ROWS python3 - "$results" "$mixed" "$OUT" <<'PY'
import json, statistics, sys, datetime, os
res_p, mixed_p, out = sys.argv[1:4]
E = os.environ
duration, rounds, conns, warmup = E["B_DURATION"], int(E["B_ROUNDS"]), E["B_CONNS"], E["B_WARMUP"]
version, base_rev, cur_rev = E["B_VERSION"], E["B_BASE_REV"], E["B_CUR_REV"]
load_start, load_mixed, load_end = E["B_LOAD_START"], E["B_LOAD_MIXED"], E["B_LOAD_END"]
round_loads = E["B_ROUND_LOADS"].split(";")
check_failed = E["B_CHECK_FAILED"] == "1"
ring = E["B_RING"].split()
rollup_diff = E["B_ROLLUP_DIFF"].split()
per_group, pristine, builds = int(E["B_PER_GROUP"]), int(E["B_PRISTINE"]), E["B_BUILDS"].split()
kinds = E["B_KINDS"].split()
rollup_rows = int(E["B_ROLLUP_ROWS"])
runs = {}
for line in open(res_p):
    rnd, kind, bin_, ops, grew, ok, d, js = line.rstrip("\n").split("\t", 7)
    runs[(kind, bin_, int(rnd))] = dict(json.loads(js), grew=int(grew), ok=ok == "1", delta=json.loads(d))
def rate(k, b, r): return runs[(k, b, r)]["ops_per_sec"]
items = {"counter": "coalesced_increments_total", "ring": "coalesced_rows_total", "rollup": "rollup_merged_rows_total"}
L = [
    "# Group commit of pristine sessions: baseline against current heatsink",
    "",
    f"- date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; baseline heatsink {base_rev}, current heatsink {cur_rev}",
    f"- machine: {os.cpu_count()} cores, shared; MariaDB {version}; client, both proxies and server share the machine",
    f"- load average (1/5/15 min): at the start {load_start}; before each round {'; '.join(round_loads)}; before the mixed runs {load_mixed}; at the end {load_end}",
    f"- other work on the machine: compiler processes (rustc, cargo, cc1, ld) running at the start {builds[0]}, at the end {builds[1]}",
    f"- invocation: `BASE_BIN=<release build of {base_rev}> CUR_BIN=<release build of {cur_rev}> ROUNDS={rounds} DURATION={duration} CONNS={conns} WARMUP={warmup} MIX_PER_GROUP={per_group} ROLLUP_ROWS={rollup_rows} scripts/bench-merge-state.sh`",
    f"- {conns} connections per leg, {duration} s per leg, {rounds} rounds; per round each kind runs through the baseline and the current proxy back to back (odd rounds baseline first, even rounds current first); one {warmup} s unrecorded warm-up leg per kind and proxy before the first round",
    "- both proxies run at once against the same MariaDB, database and rules (the rules as a DBA writes them: no coalesce key, group commit on by default); the same load generator (this tree's) drives both",
    f"- counter: `UPDATE hits SET cnt = cnt + 1 WHERE slug = 'hot'` through a [[counter]] rule (16 slots); ring: `INSERT INTO log (uid, visitor_uid, last_update) VALUES (…, NOW(6))` through a [[ring]] rule (size 5, key uid, uid in 1..1000, half on 10 hot keys); rollup: `INSERT INTO plays (created_at, track_id, user_id, country) VALUES (NOW(), …, 'US')` through two [[rollup]] rules (hour, day; half on the hot track), a log of {rollup_rows:,} rows at the start",
    f"- exact totals after every leg (counter grew / ring sequences grew / log rows grew by the acknowledged writes): {'**NO** (see the raw table)' if check_failed else 'yes, every leg'}; ring at the end: {ring[0]} keys, keys above 5 rows {ring[1]}, count/sequence mismatches {ring[2]}, wrong slots {ring[3]}; rollup groups differing from a GROUP BY over the log: hour {rollup_diff[0]}, day {rollup_diff[1]}",
    "",
    "## Throughput, current / baseline",
    "",
    "| kind | **median ratio** | per round (current / baseline) | baseline median ops/s | current median ops/s |",
    "|---|---:|---|---:|---:|",
]
for k in kinds:
    rs = [rate(k, "cur", r) / rate(k, "base", r) for r in range(1, rounds + 1)]
    L.append(f"| {k} | **{statistics.median(rs):.2f}** | {', '.join(f'{x:.2f}' for x in rs)} |"
             f" {statistics.median(rate(k, 'base', r) for r in range(1, rounds + 1)):,.0f} |"
             f" {statistics.median(rate(k, 'cur', r) for r in range(1, rounds + 1)):,.0f} |")
def cpu(k, b, r):
    j = runs[(k, b, r)]
    return j["delta"].get("proxy_cpu_us", 0) / max(j["ops"], 1)
L += [
    "",
    "The ratio is taken within each round (the two legs ran back to back), the median over rounds.",
    "",
    "## Proxy CPU per acknowledged write (user + system, from /proc)",
    "",
    "| kind | baseline median µs | current median µs | **median ratio** | per round (current / baseline) |",
    "|---|---:|---:|---:|---|",
]
for k in kinds:
    rr = range(1, rounds + 1)
    cs = [cpu(k, "cur", r) / max(cpu(k, "base", r), 1e-9) for r in rr]
    L.append(f"| {k} | {statistics.median(cpu(k, 'base', r) for r in rr):.1f} | {statistics.median(cpu(k, 'cur', r) for r in rr):.1f} |"
             f" **{statistics.median(cs):.2f}** | {', '.join(f'{x:.2f}' for x in cs)} |")
L += [
    "",
    "The same legs as the throughput table; the proxy's CPU time over the leg divided by the writes it acknowledged.",
    "",
    "## Raw numbers",
    "",
    "Merged: writes of the leg that went out as part of a merged statement (the kind's item counter: increments, ring rows, rollup rows), and the merged statements (`heatsink_coalesced_writes_total`); alone: `heatsink_merge_alone_total` over the leg, all reasons (current only).",
    "",
    "| round | kind | proxy | ops/s | p50 µs | p95 µs | p99 µs | errors | total exact | merged writes | merged statements | writes per statement | alone | proxy CPU µs per write |",
    "|---:|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
]
for r in range(1, rounds + 1):
    for k in kinds:
        for b in ("base", "cur"):
            j = runs[(k, b, r)]
            d = j["delta"]
            merged, stmts = d.get(items[k], 0), d.get("coalesced_writes_total", 0)
            alone = sum(v for n, v in d.items() if n.startswith("alone_"))
            L.append(f"| {r} | {k} | {'baseline' if b == 'base' else 'current'} | {j['ops_per_sec']:,.0f} | {j['p50_us']:,.0f} | {j['p95_us']:,.0f} | {j['p99_us']:,.0f} | {j['errors']} |"
                     f" {'yes' if j['ok'] else '**no** (%d of %d)' % (j['grew'], j['ops'])} | {merged:,} ({merged / max(j['ops'], 1):.0%}) | {stmts:,} | {merged / stmts if stmts else 0:.1f} | {'-' if b == 'base' else alone} | {cpu(k, b, r):.1f} |")
errs = sorted({e for j in runs.values() for e in j["error_samples"]})
if errs:
    L += ["", "Error samples:", ""] + [f"- `{e}`" for e in errs]

L += [
    "",
    "## Mixed sessions, current binary",
    "",
    f"{conns} connections at once for {duration} s, one load generator per group: {pristine} pristine sessions and {per_group} in each of five groups that first ran (`loadgen --setup`, on connect, before the clock):",
    "",
    "- time_zone: `SET time_zone = '+00:00'`; sql_mode: `SET sql_mode = ''` (system variables the server reports: such sessions merge with sessions of equal values, so with each other, not with pristine ones)",
    "- user_var: `SELECT @x := 1`; lock_tables: `LOCK TABLES scratch WRITE`, `UNLOCK TABLES`; temp_table: `CREATE TEMPORARY TABLE tmp_scratch (a INT)` (their writes run alone until the session is reset)",
    "",
]
mix = [l.rstrip("\n").split("\t", 5) for l in open(mixed_p)]
reasons = ["transaction", "session_state", "user_variable", "table_lock", "dynamic_sql", "temporary_table", "untracked", "lock_timeout", "write_failed"]
group_order = ["pristine", "time_zone", "sql_mode", "user_var", "lock_tables", "temp_table"]
for kind, ops, grew, ok, d, groups in mix:
    ops, d, groups = int(ops), json.loads(d), json.loads(groups)
    merged, stmts = d.get(items[kind], 0), d.get("coalesced_writes_total", 0)
    L += [
        f"### {kind}",
        "",
        f"{ops:,} writes acknowledged (total exact: {'yes' if ok == '1' else '**no**, grew by ' + grew}); merged: {merged:,} writes ({merged / max(ops, 1):.1%}) in {stmts:,} merged statements (`heatsink_coalesced_writes_total`), {merged / stmts if stmts else 0:.1f} per statement.",
        "",
        "| group | connections | writes | ops/s | p50 µs | p95 µs | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for g in group_order:
        j = groups[g]
        L.append(f"| {g} | {j['connections']} | {j['ops']:,} | {j['ops_per_sec']:,.0f} | {j['p50_us']:,.0f} | {j['p95_us']:,.0f} | {j['errors']} |")
    L += [
        "",
        "| reason (`heatsink_merge_alone_total`) | writes alone | of all writes | of the writes of the group it belongs to |",
        "|---|---:|---:|---:|",
    ]
    owner = {"user_variable": "user_var", "table_lock": "lock_tables", "temporary_table": "temp_table"}
    for r in reasons:
        n = d.get("alone_" + r, 0)
        g = owner.get(r)
        of_group = f"{n / max(groups[g]['ops'], 1):.1%} ({g})" if g else "-"
        L.append(f"| {r} | {n:,} | {n / max(ops, 1):.1%} | {of_group} |")
    L.append("")
    es = sorted({e for j in groups.values() for e in j["error_samples"]})
    if es:
        L += ["Error samples:", ""] + [f"- `{e}`" for e in es] + [""]
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
exit "$check_failed"
