#!/usr/bin/env bash
# The advise-then-apply gain, measured on the mixed workload of tests/advise.rs at
# benchmark scale: the story a DBA repeats, end to end, with nothing hand-written.
#
#   1. the application's tables in database `app` (and an identical copy `plain`);
#   2. discovery: the workload through heatsink with no rules (digests on, the
#      default) for DISCOVERY seconds;
#   3. `heatsink advise --admin … --backend-url … --large-rows … --format toml`
#      writes the rule file (its text report is kept for the results);
#      `heatsink check` and `heatsink check --backend-url` accept it;
#      `heatsink migrate --apply` builds what it needs in `app`;
#      the file is copied into the running proxy's rules directory and the admin
#      port's `RELOAD RULES` puts it in force;
#   4. rounds of three legs, the order rotated every round:
#        A       the workload through a second heatsink with no rules, on `plain`
#        B       the workload through the heatsink with the advised rules, on `app`
#        direct  the workload straight to MariaDB, on `plain`
#      `plain` is the fair same-run baseline: the tables as they were before the
#      migration (no rollup or ring triggers on the logs, Messages not partitioned).
#      A and direct share it (both append to it, interleaved, so they see the same
#      growth); B has its own copy, migrated.
#   5. exactness after the legs, through the proxy with the rules: the counter total
#      equals the increments acknowledged in `app`, no ring key holds more than the
#      ring's size, every rollup equals a GROUP BY over its log, timeline reads and
#      lookups by key equal the same statements sent directly, on a sample.
#
# The workload (sysbench Lua, one process per stream, text protocol, autocommit;
# an event is one statement except where said):
#   counter    UPDATE hits SET cnt = cnt + 1 WHERE slug = ?  (85 % 'home')   T_COUNTER (16)
#   ring       a visit recorded: INSERT INTO visits …, and on every 8th the
#              application's purge down to the newest 5 of that uid (a DELETE
#              joined with a ranked derived table); every 5th event instead a read
#              of a uid's newest 5. Half the uids are 10 hot ones.              T_RING (16)
#              Under the ring rule the purge is refused (the ring keeps 5 per key:
#              advise says so), so in leg B a visit recorded is the insert alone.
#   rollup     INSERT INTO plays …, every 3rd event the 7-day count per track and
#              country of one track (80 % track 7)                             T_ROLLUP (8)
#   partition  SELECT Message FROM Messages WHERE UUID = ? (a key with unix
#              seconds between dashes)                                          T_PARTITION (8)
#   retention  DELETE FROM Messages WHERE Inserted < CURDATE() - INTERVAL 30 DAY,
#              one client at RETENTION_RATE (1) per second (open loop)
#   timeline   the friends-timeline JOIN of a random reader, LIMIT 20           T_TIMELINE (8)
#   decoys     in turn: a cold random-key increment (scores), a lookup by an
#              auto-increment id (orders), a plain insert (audit), an aggregate
#              over a 50-row table (recent)                                     T_DECOYS (8)
#
#   scripts/bench-advise.sh                        # about 15 minutes
#   ROUNDS=1 DURATION=10 DISCOVERY=20 ROWS=100000 scripts/bench-advise.sh   # a quick check
#
# Environment: DURATION (s per leg, 30), ROUNDS (5), DISCOVERY (s, 60), ROWS (rows
# of each large table, 600000), LARGE_ROWS (advise --large-rows, 500000), T_*,
# RETENTION_RATE, SKIP_BUILD=1, HEATSINK_BIN, OUT (bench/results/advise.md),
# HS_KEEP_TMP=1, B_READING (a Markdown file: the reading, placed under the whole-mix table).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/mariadb.sh
source "$SCRIPT_DIR/lib/mariadb.sh"
cd "$HS_REPO_DIR"

DURATION=${DURATION:-30}
ROUNDS=${ROUNDS:-5}
DISCOVERY=${DISCOVERY:-60}
ROWS=${ROWS:-600000}
LARGE_ROWS=${LARGE_ROWS:-500000}
T_COUNTER=${T_COUNTER:-16}
T_RING=${T_RING:-16}
T_ROLLUP=${T_ROLLUP:-8}
T_PARTITION=${T_PARTITION:-8}
T_TIMELINE=${T_TIMELINE:-8}
T_DECOYS=${T_DECOYS:-8}
RETENTION_RATE=${RETENTION_RATE:-1}
OUT=${OUT:-bench/results/advise.md}
export MARIADB_EXTRA_ARGS=${MARIADB_EXTRA_ARGS:---innodb-buffer-pool-size=1G}
ADMIN_PW=advise-bench-pw

hs_install_traps
[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink
HEATSINK_BIN=${HEATSINK_BIN:-$HS_REPO_DIR/target/release/heatsink}
export HEATSINK_BIN
REV=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo " (uncommitted changes)")

hs_tmpdir_into WORK advise
RAW=$WORK/raw.tsv # round leg stream events seconds errors p50_ms p99_ms
: >"$RAW"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

mariadb_start
BASE=$(mariadb_root -N -e 'SELECT UNIX_TIMESTAMP()')

# The application's tables: tests/advise.rs's mixed workload, the large tables at
# $ROWS rows. Deterministic (the keys count back from $BASE), so `plain` is a copy.
hs_log "loading app ($ROWS rows per large table)"
mariadb_root -e "CREATE DATABASE app; CREATE DATABASE plain"
mariadb_root app -e "
  CREATE TABLE hits (id INT AUTO_INCREMENT PRIMARY KEY, slug VARCHAR(64) NOT NULL UNIQUE, cnt INT NOT NULL DEFAULT 0);
  INSERT INTO hits (slug) SELECT CONCAT('p', seq) FROM seq_1_to_50;
  INSERT INTO hits (slug) VALUES ('home');
  CREATE TABLE scores (id INT PRIMARY KEY, points INT NOT NULL DEFAULT 0);
  INSERT INTO scores (id) SELECT seq FROM seq_1_to_100000;
  CREATE TABLE visits (id BIGINT AUTO_INCREMENT PRIMARY KEY, uid INT NOT NULL, visitor INT NOT NULL, at DATETIME(6) NOT NULL, KEY (uid, id));
  INSERT INTO visits (uid, visitor, at) SELECT 1 + seq % 1000, seq, NOW(6) FROM seq_1_to_5000;
  CREATE TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, track_id INT NOT NULL, country CHAR(2) NOT NULL, created_at DATETIME NOT NULL, KEY (track_id), KEY (created_at));
  INSERT INTO plays (track_id, country, created_at) SELECT IF(seq % 10 = 0, 7, seq % 500), ELT(1 + seq % 5, 'de', 'fr', 'us', 'jp', 'br'), NOW() - INTERVAL (seq % 43200) MINUTE FROM seq_1_to_$ROWS;
  CREATE TABLE recent (id INT AUTO_INCREMENT PRIMARY KEY, grp INT NOT NULL, created_at DATETIME NOT NULL);
  INSERT INTO recent (grp, created_at) SELECT seq % 5, NOW() - INTERVAL seq HOUR FROM seq_1_to_50;
  CREATE TABLE Messages (id BIGINT AUTO_INCREMENT PRIMARY KEY, UUID VARCHAR(64) NOT NULL, Message VARCHAR(200) NOT NULL, Inserted DATE NOT NULL, UNIQUE KEY (UUID));
  INSERT INTO Messages (UUID, Message, Inserted) SELECT CONCAT(LPAD(HEX(seq), 8, '0'), '-', $BASE - seq * 4, '-', LPAD(HEX(seq * 7), 8, '0')), CONCAT('m', seq), DATE(FROM_UNIXTIME($BASE - seq * 4)) FROM seq_1_to_$ROWS;
  CREATE TABLE orders (id INT AUTO_INCREMENT PRIMARY KEY, customer INT NOT NULL, total INT NOT NULL);
  INSERT INTO orders (customer, total) SELECT seq % 700, seq % 90 FROM seq_1_to_$ROWS;
  CREATE TABLE message (id BIGINT AUTO_INCREMENT PRIMARY KEY, user_id INT NOT NULL, body VARCHAR(100) NOT NULL, KEY (user_id, id));
  INSERT INTO message (user_id, body) SELECT seq % 1000, CONCAT('b', seq) FROM seq_1_to_$ROWS;
  CREATE TABLE follower (user_id INT NOT NULL, follower_id INT NOT NULL, PRIMARY KEY (user_id, follower_id));
  INSERT IGNORE INTO follower SELECT s1.seq, (s1.seq * 7 + s2.seq * 13) % 1000 FROM seq_1_to_1000 s1, seq_1_to_20 s2;
  CREATE TABLE audit (id INT AUTO_INCREMENT PRIMARY KEY, what VARCHAR(64) NOT NULL);"
TABLES="hits scores visits plays recent Messages orders message follower audit"
for t in $TABLES; do
  mariadb_root -e "CREATE TABLE plain.$t LIKE app.$t; INSERT INTO plain.$t SELECT * FROM app.$t"
done
mariadb_root -e "ANALYZE TABLE $(for t in $TABLES; do printf 'app.%s, plain.%s, ' "$t" "$t"; done | sed 's/, $//')" >/dev/null
hs_log "loaded"

# The workload: one Lua script per stream ($1: 1 when the application still runs its
# ring purge).
write_lua() {
  local dir=$1 purge=$2
  local head='local n = 0
function thread_init()
  drv = sysbench.sql.driver()
  con = drv:connect()
end
function thread_done()
  con:disconnect()
end
local function uid()
  return (sysbench.rand.uniform(1, 2) == 1) and sysbench.rand.uniform(1, 10) or sysbench.rand.uniform(11, 1000)
end'
  cat >"$dir/counter.lua" <<LUA
$head
function event()
  local slug = (sysbench.rand.uniform(1, 100) <= 85) and 'home' or ('p' .. sysbench.rand.uniform(1, 50))
  con:query("UPDATE hits SET cnt = cnt + 1 WHERE slug = '" .. slug .. "'")
end
LUA
  cat >"$dir/ring.lua" <<LUA
$head
local purge = $purge == 1
local recorded = 0
function event()
  n = n + 1
  local u = uid()
  if n % 5 == 0 then
    con:query(string.format("SELECT visitor, at FROM visits WHERE uid = %d ORDER BY id DESC LIMIT 5", u))
    return
  end
  con:query(string.format("INSERT INTO visits (uid, visitor, at) VALUES (%d, %d, NOW(6))", u, sysbench.rand.uniform(1, 1000000)))
  recorded = recorded + 1
  if purge and recorded % 8 == 0 then
    con:query(string.format("DELETE l FROM visits l JOIN (SELECT uid, id FROM visits WHERE uid = %d ORDER BY id DESC LIMIT 1 OFFSET 4) t ON l.uid = t.uid AND l.id < t.id", u))
  end
end
LUA
  cat >"$dir/rollup.lua" <<LUA
$head
function event()
  n = n + 1
  local track = (sysbench.rand.uniform(1, 10) <= 8) and 7 or sysbench.rand.uniform(0, 499)
  if n % 3 == 0 then
    con:query(string.format("SELECT track_id, country, COUNT(*) AS total FROM plays WHERE track_id = %d AND created_at BETWEEN NOW() - INTERVAL 7 DAY AND NOW() GROUP BY track_id, country", track))
  else
    con:query(string.format("INSERT INTO plays (track_id, country, created_at) VALUES (%d, '%s', NOW())", track, ({'de','fr','us','jp','br'})[sysbench.rand.uniform(1, 5)]))
  end
end
LUA
  cat >"$dir/partition.lua" <<LUA
$head
function event()
  local s = sysbench.rand.uniform(1, $ROWS)
  con:query(string.format("SELECT Message FROM Messages WHERE UUID = '%08X-%d-%08X'", s, $BASE - s * 4, s * 7))
end
LUA
  cat >"$dir/retention.lua" <<LUA
$head
function event()
  con:query("DELETE FROM Messages WHERE Inserted < CURDATE() - INTERVAL 30 DAY")
end
LUA
  cat >"$dir/timeline.lua" <<LUA
$head
function event()
  con:query(string.format("SELECT message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id WHERE follower.user_id = %d ORDER BY message.id DESC LIMIT 20", sysbench.rand.uniform(1, 1000)))
end
LUA
  cat >"$dir/decoys.lua" <<LUA
$head
function event()
  n = n + 1
  local k = n % 4
  if k == 0 then
    con:query(string.format("UPDATE scores SET points = points + 1 WHERE id = %d", sysbench.rand.uniform(1, 100000)))
  elseif k == 1 then
    con:query(string.format("SELECT customer, total FROM orders WHERE id = %d", sysbench.rand.uniform(1, $ROWS)))
  elseif k == 2 then
    con:query(string.format("INSERT INTO audit (what) VALUES ('x%d')", sysbench.rand.uniform(1, 1000000)))
  else
    con:query("SELECT grp, COUNT(*) FROM recent WHERE created_at >= NOW() - INTERVAL 1 DAY GROUP BY grp")
  end
end
LUA
}
mkdir -p "$WORK/lua-purge" "$WORK/lua-rule"
write_lua "$WORK/lua-purge" 1
write_lua "$WORK/lua-rule" 0
STREAMS="counter ring rollup partition retention timeline decoys"
threads_of() {
  case $1 in
  counter) echo "$T_COUNTER" ;; ring) echo "$T_RING" ;; rollup) echo "$T_ROLLUP" ;;
  partition) echo "$T_PARTITION" ;; retention) echo 1 ;; timeline) echo "$T_TIMELINE" ;;
  decoys) echo "$T_DECOYS" ;;
  esac
}

# run_mix NAME PORT DB LUA-DIR SECONDS -> every stream at once; logs in $WORK/NAME-<stream>.log
run_mix() {
  local name=$1 port=$2 db=$3 lua=$4 secs=$5 s pids=() rate pid rc=0
  for s in $STREAMS; do
    rate=0
    [[ $s == retention ]] && rate=$RETENTION_RATE
    sysbench "$lua/$s.lua" --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$port" \
      --mysql-user="$SB_USER" --mysql-password="$SB_PASSWORD" --mysql-db="$db" \
      --mysql-ignore-errors=1213,1205 --threads="$(threads_of "$s")" --time="$secs" \
      --rate="$rate" --histogram=on --percentile=99 --report-interval=0 run \
      >"$WORK/$name-$s.log" 2>&1 &
    pid=$!
    hs_register_pid "$pid"
    pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || rc=$?
    hs_forget_pid "$pid"
  done
  if ((rc != 0)); then
    for s in $STREAMS; do tail -n 5 "$WORK/$name-$s.log" >&2; done
    hs_die "sysbench $name failed"
  fi
}

# Discovery: the proxy the DBA put in front, with no rules and its admin port.
hs_tmpdir_into RULES rules
ADMIN_PORT=$(hs_free_port)
HEATSINK_ADMIN_PASSWORD=$ADMIN_PW HS_RULES_DIR=$RULES heatsink_start "$MARIADB_PORT" --admin "127.0.0.1:$ADMIN_PORT"
HS_PORT=$HEATSINK_PORT HS_LOG=$HEATSINK_LOG
admin() { mariadb --no-defaults --protocol=tcp -h127.0.0.1 -P"$ADMIN_PORT" -uadmin -p"$ADMIN_PW" "$@"; }
hs_log "discovery: the workload through heatsink without rules for ${DISCOVERY}s"
run_mix discovery "$HS_PORT" app "$WORK/lua-purge" "$DISCOVERY"
admin -e 'SHOW DIGESTS ORDER BY sum_time_us DESC LIMIT 12' >"$WORK/digests.txt"

APP_URL="mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$MARIADB_PORT/app"
ADMIN_URL="mysql://admin:$ADMIN_PW@127.0.0.1:$ADMIN_PORT"
"$HEATSINK_BIN" advise --admin "$ADMIN_URL" --backend-url "$APP_URL" --large-rows "$LARGE_ROWS" \
  >"$WORK/advise.txt" 2>&1 || { cat "$WORK/advise.txt" >&2; hs_die "heatsink advise failed"; }
"$HEATSINK_BIN" advise --admin "$ADMIN_URL" --backend-url "$APP_URL" --large-rows "$LARGE_ROWS" \
  --format toml >"$WORK/advised.toml" 2>"$WORK/advise-toml.err" || { cat "$WORK/advise-toml.err" >&2; hs_die "heatsink advise --format toml failed"; }
cat "$WORK/advise.txt" >&2
mkdir -p "$WORK/advised"
cp "$WORK/advised.toml" "$WORK/advised/advised.toml"
"$HEATSINK_BIN" check --rules "$WORK/advised" >"$WORK/check.txt" 2>&1 ||
  { cat "$WORK/check.txt" >&2; hs_die "heatsink check refused the advised rules"; }
"$HEATSINK_BIN" migrate --rules "$WORK/advised" --backend-url "$APP_URL" --apply >"$WORK/migrate.txt" 2>&1 ||
  { cat "$WORK/migrate.txt" >&2; hs_die "heatsink migrate --apply failed"; }
"$HEATSINK_BIN" check --rules "$WORK/advised" --backend-url "$APP_URL" >"$WORK/check-live.txt" 2>&1 ||
  { cat "$WORK/check-live.txt" >&2; hs_die "heatsink check --backend-url refused the advised rules"; }
cp "$WORK/advised.toml" "$RULES/advised.toml"
admin -vvv -e 'RELOAD RULES' >"$WORK/reload.txt" 2>&1 || { cat "$WORK/reload.txt" >&2; hs_die "RELOAD RULES failed"; }
hs_log "RELOAD RULES: $(grep -i -m1 'rules\|ok' "$WORK/reload.txt" || true)"
mariadb_root -e "ANALYZE TABLE $(for t in $TABLES; do printf 'app.%s, ' "$t"; done | sed 's/, $//')" >/dev/null

# Leg A's proxy: the same binary, no rules.
heatsink_start "$MARIADB_PORT"
A_PORT=$HEATSINK_PORT

# leg ROUND NAME SECONDS -> lines in $RAW (round 0: warm-up, not recorded)
leg() {
  local round=$1 name=$2 port db lua s log events secs errors p50 p99
  case $name in
  A) port=$A_PORT db=plain lua=$WORK/lua-purge ;;
  B) port=$HS_PORT db=app lua=$WORK/lua-rule ;;
  direct) port=$MARIADB_PORT db=plain lua=$WORK/lua-purge ;;
  esac
  run_mix "$name-$round" "$port" "$db" "$lua" "$3"
  local line="round $round $name:"
  for s in $STREAMS; do
    log=$WORK/$name-$round-$s.log
    events=$(sed -n 's/^ *total number of events: *\([0-9]*\)/\1/p' "$log" | sed -n 1p)
    secs=$(sed -n 's/^ *total time: *\([0-9.]*\)s/\1/p' "$log" | sed -n 1p)
    errors=$(sed -n 's/^ *ignored errors: *\([0-9]*\).*/\1/p' "$log" | sed -n 1p)
    read -r p50 p99 < <(python3 "$SCRIPT_DIR/lib/sysbench_histogram.py" "$log" 50 99)
    ((round == 0)) || printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$name" "$s" "$events" "$secs" "${errors:-0}" "$p50" "$p99" >>"$RAW"
    line+=" $s $events"
  done
  hs_log "$line"
}

for name in A B direct; do leg 0 "$name" 5; done
LEGS=(A B direct)
for ((round = 1; round <= ROUNDS; round++)); do
  for ((i = 0; i < 3; i++)); do
    leg "$round" "${LEGS[$(((i + round - 1) % 3))]}" "$DURATION"
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# Exactness, through the proxy with the rules, on `app`.
CHECKS=$WORK/checks.txt
: >"$CHECKS"
hs_q() { mariadb --no-defaults --protocol=tcp -h127.0.0.1 -P"$HS_PORT" -u"$SB_USER" -p"$SB_PASSWORD" app -N -B "$@"; }
direct_q() { mariadb_root app -N -B "$@"; }
acked=0
for log in "$WORK"/discovery-counter.log "$WORK"/B-*-counter.log; do
  e=$(sed -n 's/^ *total number of events: *\([0-9]*\)/\1/p' "$log" | sed -n 1p)
  acked=$((acked + e))
done
got=$(hs_q -e "SELECT SUM(cnt) FROM hits")
echo "counter: $acked increments acknowledged in app (discovery, warm-up and leg B); SUM(cnt) through heatsink reads $got" >>"$CHECKS"
python3 - "$WORK/advised.toml" >"$WORK/rules.sh" <<'PY'
import sys, tomllib, shlex
r = tomllib.load(open(sys.argv[1], "rb"))
for x in r.get("ring", []):
    print(f"ring {shlex.quote(x['table'])} {shlex.quote(','.join(x['key']))} {x['size']}")
for x in r.get("rollup", []):
    print(f"rollup {shlex.quote(x['table'])} {shlex.quote(x['rollup_table'])} {shlex.quote(x['time'])} {x['bucket']} {shlex.quote(','.join(x.get('dimensions', [])))}")
PY
while read -r kind a b c d e; do
  case $kind in
  ring)
    over=$(hs_q -e "SELECT COUNT(*) FROM (SELECT $b FROM $a GROUP BY $b HAVING COUNT(*) > $c) k")
    keys=$(hs_q -e "SELECT COUNT(*) FROM (SELECT $b FROM $a GROUP BY $b) k")
    echo "ring $a: $keys keys through heatsink, keys holding more than $c rows: $over" >>"$CHECKS"
    ;;
  rollup)
    fmt='%Y-%m-%d %H:00:00'
    [[ $d == day ]] && fmt='%Y-%m-%d'
    IFS=, read -r -a dims <<<"$e"
    sel="" nulls="" i=0
    for x in "${dims[@]}"; do
      sel+="IFNULL($x, 0), " # every dimension of this workload is NOT NULL
      nulls+="($x IS NULL) << $i | "
      i=$((i + 1))
    done
    diff=$(direct_q -e "
      SELECT COUNT(*) FROM (
        SELECT 1 FROM (
          SELECT $e, hs_nulls, hs_bucket, hs_rows AS n FROM $b
          UNION ALL
          SELECT $sel ${nulls}(($c IS NULL) << 31),
                 IFNULL(CAST(DATE_FORMAT($c, '$fmt') AS DATETIME), '1000-01-01 00:00:00'), -1 FROM $a
        ) u GROUP BY $e, hs_nulls, hs_bucket HAVING SUM(n) <> 0) d")
    rows=$(direct_q -e "SELECT (SELECT COUNT(*) FROM $a), (SELECT SUM(hs_rows) FROM $b)" | tr '\t' '/')
    echo "rollup $b: groups differing from a GROUP BY over $a: $diff (log rows / Σ hs_rows: $rows)" >>"$CHECKS"
    ;;
  esac
done <"$WORK/rules.sh"
differ=0
for u in $(seq 7 19 1000); do
  q="SELECT message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id WHERE follower.user_id = $u ORDER BY message.id DESC LIMIT 20"
  [[ "$(hs_q -e "$q")" == "$(direct_q -e "$q")" ]] || differ=$((differ + 1))
done
echo "timeline: of 53 readers' timelines, read through heatsink and sent directly, differing: $differ" >>"$CHECKS"
differ=0
for s in $(seq 11 11311 "$ROWS"); do
  q=$(printf "SELECT Message FROM Messages WHERE UUID = '%08X-%d-%08X'" "$s" $((BASE - s * 4)) $((s * 7)))
  [[ "$(hs_q -e "$q")" == "$(direct_q -e "$q")" ]] || differ=$((differ + 1))
done
echo "partition: of $(seq 11 11311 "$ROWS" | wc -l) lookups by key through heatsink and sent directly, differing: $differ" >>"$CHECKS"
admin -t -e "SHOW RULE STATS" >"$WORK/rule-stats.txt" 2>&1 || true
admin -e 'SHOW DIGESTS ORDER BY sum_time_us DESC LIMIT 12' >"$WORK/digests-after.txt" 2>&1 || true
cat "$CHECKS" >&2
SB_VERSION=$(sysbench --version | awk '{print $2}')

B_REV=$REV B_VERSION=$MARIADB_VERSION B_SYSBENCH=$SB_VERSION B_LOAD_START=$load_start \
  B_LOAD_END=$load_end B_DURATION=$DURATION B_ROUNDS=$ROUNDS B_DISCOVERY=$DISCOVERY B_ROWS=$ROWS \
  B_LARGE=$LARGE_ROWS B_RATE=$RETENTION_RATE \
  B_THREADS="counter $T_COUNTER, ring $T_RING, rollup $T_ROLLUP, partition $T_PARTITION, retention 1 (${RETENTION_RATE}/s), timeline $T_TIMELINE, decoys $T_DECOYS" \
  python3 "$SCRIPT_DIR/lib/advise_report.py" "$RAW" "$CHECKS" "$WORK/advised.toml" "$WORK/advise.txt" "$WORK/migrate.txt" "$WORK/rule-stats.txt" "$OUT"
