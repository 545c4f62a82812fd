#!/usr/bin/env bash
# Lookups by a key that carries its time, on a day-partitioned table, in one run
# against one private MariaDB (session time zone UTC):
#   1. `Messages` (the issue's table) with BACK + 4 daily partitions (BACK default 88: today
#      - 88 … today + 3) and a catch-all, ROWS rows (default 3000000) spread evenly
#      over the BACK + 1 days up to today; each key is `<10 hex>-<unix seconds>-<10 hex>`
#      and `Inserted` its date. Filled with INSERT … SELECT FROM seq_1_to_N.
#   2. the [[partition]] rule (`heatsink migrate --apply`: the insert triggers).
#   3. lookups by key of KEYS existing keys (default 5000, random order) at CONNS
#      connections (default 16), DURATION seconds each (default 10), ROUNDS rounds
#      (default 3, legs interleaved, medians):
#        direct     `SELECT Message FROM Messages WHERE UUID = '…'` straight to MariaDB
#                   (every partition probed)
#        heatsink   the same statements through heatsink (pruned to 3 partitions)
#        hand       (reference) the statement with the predicate written by hand,
#                   straight to MariaDB
#      text protocol (each lookup a different statement text, as an application
#      that inlines its keys sends them).
#   4. expiring one day (≈ ROWS / (BACK + 1) rows) while CONNS connections look keys up
#      through heatsink (retention_days = 87, so the first day is expired): DELETE
#      of the oldest kept day's rows, then `heatsink maintain --job rotate` dropping
#      the expired day's partition; the time of each and the lookups' p99 during
#      each (1 s windows).
# Writes bench/results/partition.md (OUT). Quick check: ROWS=300000 DURATION=3 ROUNDS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-3000000}
KEYS=${KEYS:-5000}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
OUT=${OUT:-bench/results/partition.md}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
HEATSINK_BIN=${HEATSINK_BIN:-$TARGET_DIR/release/heatsink}
LOADGEN=${LOADGEN:-$TARGET_DIR/release/examples/loadgen}
export HEATSINK_BIN
MARIADB_EXTRA_ARGS=${MARIADB_EXTRA_ARGS:---innodb-buffer-pool-size=2G --default-time-zone=+00:00}
export MARIADB_EXTRA_ARGS
BACK=${BACK:-88}   # days of data before today
AHEAD=3   # premade days

[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink --example loadgen
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
mariadb_start

today=$(mariadb_root -N -e "SELECT CURDATE()")
parts=$(python3 - "$today" "$BACK" "$AHEAD" <<'PY'
import datetime, sys
t = datetime.date.fromisoformat(sys.argv[1])
out = []
for d in range(-int(sys.argv[2]), int(sys.argv[3]) + 1):
    day = t + datetime.timedelta(days=d)
    out.append(f"PARTITION p{day:%Y%m%d} VALUES LESS THAN ('{day + datetime.timedelta(days=1)}')")
out.append("PARTITION pmax VALUES LESS THAN (MAXVALUE)")
print(", ".join(out))
PY
)
mariadb_root -e "CREATE DATABASE links; USE links;
CREATE TABLE Messages (ID BIGINT AUTO_INCREMENT, UUID VARCHAR(40) NOT NULL,
  Message JSON NOT NULL, Inserted DATE NOT NULL,
  PRIMARY KEY (ID, Inserted), UNIQUE KEY (UUID, Inserted)) ENGINE=InnoDB
  PARTITION BY RANGE COLUMNS (Inserted) ($parts);"
nparts=$(mariadb_root -N -e "SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA='links' AND TABLE_NAME='Messages'")

# Row n of N: (n - 1) * (BACK + 1) days / N after the first day's start.
SPAN=$(((BACK + 1) * 86400))
CHUNK=250000
fill_start=$(date +%s.%N)
for ((lo = 1; lo <= ROWS; lo += CHUNK)); do
  hi=$((lo + CHUNK - 1 < ROWS ? lo + CHUNK - 1 : ROWS))
  mariadb_root links -e "
    SET @t0 = UNIX_TIMESTAMP(CURDATE() - INTERVAL $BACK DAY);
    INSERT INTO Messages (UUID, Message, Inserted)
    SELECT CONCAT(LPAD(LOWER(HEX((seq * 2654435761) % 1099511627776)), 10, '0'), '-', t, '-',
                  LPAD(LOWER(HEX(seq)), 10, '0')),
           JSON_OBJECT('url', CONCAT('https://example.com/', seq), 'n', seq),
           DATE(FROM_UNIXTIME(t))
    FROM (SELECT seq, @t0 + FLOOR((seq - 1) * $SPAN / $ROWS) AS t FROM seq_${lo}_to_${hi}) s"
done
fill_s=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$fill_start" "$(date +%s.%N)")
mariadb_root links -e "ANALYZE TABLE Messages" >/dev/null
rows=$(mariadb_root -N links -e "SELECT COUNT(*) FROM Messages")
hs_log "Messages: $rows rows in $nparts partitions, filled in ${fill_s}s"

url() { echo "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$1/links"; }
rules=""
hs_tmpdir_into rules rules-partition
cat >"$rules/partition.toml" <<EOF
[[partition]]
name = "messages_by_day"
table = "links.Messages"
key = "UUID"
key_time = "unix"
key_pattern = "-([0-9]{10})-"
column = "Inserted"
period = "day"
retention_days = $((BACK - 1))
premake = $AHEAD
tolerance_days = 1
EOF
"$HEATSINK_BIN" migrate --rules "$rules" --backend-url "$(url "$MARIADB_PORT")" --apply >/dev/null
HS_RULES_DIR=$rules heatsink_start "$MARIADB_PORT"

sqldir=""
hs_tmpdir_into sqldir sql
results=$(mktemp)
trap 'rm -f "$results"; hs_cleanup' EXIT
mariadb_root -N links -e "SELECT UUID FROM Messages ORDER BY RAND() LIMIT $KEYS" >"$sqldir/keys"
sed "s/.*/SELECT Message FROM Messages WHERE UUID = '&'/" "$sqldir/keys" >"$sqldir/lookup.sql"
python3 - "$sqldir/keys" >"$sqldir/hand.sql" <<'PY'
import sys
for k in open(sys.argv[1]).read().split():
    t = int(k.split("-")[1])
    print(f"SELECT Message FROM Messages WHERE UUID = '{k}' AND Inserted BETWEEN "
          f"DATE(FROM_UNIXTIME({t})) - INTERVAL 1 DAY AND DATE(FROM_UNIXTIME({t})) + INTERVAL 1 DAY")
PY
# The rewrite returns what the statement returns (spot check of 200 keys).
{
  echo "USE links;"
  head -200 "$sqldir/lookup.sql" | sed 's/$/;/'
} >"$sqldir/check.sql"
a=$(mariadb_root -N <"$sqldir/check.sql" | md5sum)
b=$(mariadb_sb "$HEATSINK_PORT" -N <"$sqldir/check.sql" | md5sum)
[[ $a == "$b" ]] || hs_die "answers through heatsink differ from direct ones"
explain=$(mariadb_sb "$HEATSINK_PORT" -N -e "USE links; EXPLAIN FORMAT=JSON $(head -1 "$sqldir/lookup.sql")" |
  python3 -c 'import re,sys; m = re.search(r"\"partitions\": \[([^]]*)\]", sys.stdin.read()); print(len(re.findall(r"\"[^\"]+\"", m.group(1))) if m else 0)')
hs_log "partitions read by a lookup through heatsink: $explain of $nparts"

loadgen() {
  local u=$1 label=$2 f
  shift 2
  f=$(mktemp "$sqldir/out.XXXXXX")
  hs_run "$LOADGEN" --url "$u" --json --label "$label" "$@" >"$f"
  cat "$f"
}
jget() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

legs=(direct heatsink hand)
# Warm the buffer pool for every leg first (the unpruned lookups touch every
# partition's index), unmeasured.
for leg in direct heatsink; do
  port=$MARIADB_PORT
  [[ $leg == heatsink ]] && port=$HEATSINK_PORT
  loadgen "$(url "$port")" "warm-$leg" -c "$CONNS" -d "$DURATION" --sql-file "$sqldir/lookup.sql" --mix random >/dev/null
done
for ((r = 0; r < ROUNDS; r++)); do
  for ((i = 0; i < ${#legs[@]}; i++)); do
    leg=${legs[(i + r) % ${#legs[@]}]}
    case $leg in
      direct) port=$MARIADB_PORT; file=lookup.sql; prep=() ;;
      heatsink) port=$HEATSINK_PORT; file=lookup.sql; prep=() ;;
      hand) port=$MARIADB_PORT; file=hand.sql; prep=() ;;
    esac
    j=$(loadgen "$(url "$port")" "$leg" -c "$CONNS" -d "$DURATION" --warmup 1 \
      --sql-file "$sqldir/$file" --mix random "${prep[@]}")
    printf '%s\t%s\t%s\t%s\t%s\n' "$leg" "$r" "$(jget "$j" ops_per_sec)" "$(jget "$j" p99_us)" "$(jget "$j" errors)" >>"$results"
    hs_log "round $r $leg: $(jget "$j" ops_per_sec)/s p99 $(jget "$j" p99_us) us errors $(jget "$j" errors)"
  done
done

# Expiring a day under load: lookups through heatsink in 1 s windows meanwhile.
windows() {
  local label=$1 secs=$2
  : >"$sqldir/$label.windows"
  for ((w = 0; w < secs; w++)); do
    loadgen "$(url "$HEATSINK_PORT")" "$label" -c "$CONNS" -d 1 --sql-file "$sqldir/lookup.sql" --mix random >>"$sqldir/$label.windows"
  done
}
p99_max() { python3 -c 'import json,sys; print(max(json.loads(l)["p99_us"] for l in open(sys.argv[1]) if l.strip()))' "$1"; }
windows idle 3
# Retention BACK - 1: the first day (today - BACK) is expired, the next one kept.
oldest_kept=$(mariadb_root -N -e "SELECT CURDATE() - INTERVAL $((BACK - 1)) DAY")
expired=$(mariadb_root -N -e "SELECT CURDATE() - INTERVAL $BACK DAY")
del_rows=$(mariadb_root -N links -e "SELECT COUNT(*) FROM Messages WHERE Inserted = '$oldest_kept'")
drop_rows=$(mariadb_root -N links -e "SELECT COUNT(*) FROM Messages WHERE Inserted = '$expired'")
# The drop first: a DELETE leaves purge work on the table, and purge holds the
# table's metadata lock in turns, which an ALTER right after it must wait for.
windows drop 10 &
wpid=$!
sleep 1
t2=$(date +%s.%N)
"$HEATSINK_BIN" maintain --rules "$rules" --backend-url "$(url "$MARIADB_PORT")" --job rotate --apply >"$sqldir/rotate.log" 2>&1 ||
  { cat "$sqldir/rotate.log" >&2; hs_die "maintain --job rotate failed"; }
t3=$(date +%s.%N)
wait "$wpid"
windows delete 30 &
wpid=$!
sleep 1
t0=$(date +%s.%N)
mariadb_root links -e "DELETE FROM Messages WHERE Inserted = '$oldest_kept'"
t1=$(date +%s.%N)
wait "$wpid"
ddl_s=$(sed -n 's/^-- dropped in \([0-9.]*\) s.*$/\1/p' "$sqldir/rotate.log")
delete_s=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$t0" "$t1")
drop_s=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$t2" "$t3")
left=$(mariadb_root -N links -e "SELECT COUNT(*) FROM Messages WHERE Inserted = '$expired'")
hs_log "delete of $del_rows rows: ${delete_s}s; rotate (drop of $drop_rows rows' partition, $left left): ${drop_s}s"
hs_log "$(cat "$sqldir/rotate.log")"

load=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$load" "$results" "$OUT" "$rows" "$nparts" "$CONNS" "$DURATION" "$ROUNDS" "$explain" \
  "$delete_s" "$drop_s" "$del_rows" "$drop_rows" "$(p99_max "$sqldir/idle.windows")" \
  "$(p99_max "$sqldir/delete.windows")" "$(p99_max "$sqldir/drop.windows")" "$MARIADB_VERSION" "$fill_s" "$ddl_s" <<'PY'
import statistics, sys
load = sys.argv.pop(1)
(res, out, rows, nparts, conns, dur, rounds, explain, delete_s, drop_s, del_rows, drop_rows,
 p99_idle, p99_delete, p99_drop, version, fill_s, ddl_s) = sys.argv[1:]
legs = {}
for line in open(res):
    leg, r, qps, p99, err = line.split("\t")
    legs.setdefault(leg, []).append((float(qps), float(p99), int(err)))
med = {k: statistics.median(q for q, _, _ in v) for k, v in legs.items()}
p99 = {k: statistics.median(p for _, p, _ in v) for k, v in legs.items()}
errs = {k: sum(e for _, _, e in v) for k, v in legs.items()}
per_round = lambda a, b: ", ".join(f"{x[0] / y[0]:.2f}" for x, y in zip(legs[a], legs[b]))
with open(out, "w") as f:
    f.write(f"""# Partition rule: lookups by key, expiring a day

`scripts/bench-partition.sh`, MariaDB {version}, this 2-core VM, one run. `Messages` as in the
issue: {rows} rows in {nparts} partitions (one per day, today − {int(nparts) - 5} … today + 3, and a
catch-all), keys `<hex>-<unix seconds>-<hex>`, filled in {fill_s} s. Lookups of random
existing keys (`SELECT Message FROM Messages WHERE UUID = '…'`) at {conns} connections,
{dur} s per leg, {rounds} rounds with the legs interleaved, medians. A lookup through
heatsink reads {explain} partitions (`EXPLAIN FORMAT=JSON`); sent directly, all {nparts}.

| leg | lookups/s | p99 µs | errors | × direct |
|---|---:|---:|---:|---:|
""")
    names = {"direct": "direct (unpruned)", "heatsink": "through heatsink (pruned)",
             "hand": "direct, predicate written by hand"}
    for k in ["direct", "heatsink", "hand"]:
        f.write(f"| {names[k]} | {med[k]:.0f} | {p99[k]:.0f} | {errs[k]} | {med[k] / med['direct']:.2f} |\n")
    f.write(f"""
Per round, heatsink ÷ direct: {per_round('heatsink', 'direct')};
heatsink ÷ the hand-written predicate: {per_round('heatsink', 'hand')}.

## Expiring a day

While {conns} connections look keys up through heatsink (1 s windows, worst p99 of the windows):

| | rows | time s | lookups' p99 µs |
|---|---:|---:|---:|
| idle (before) | | | {float(p99_idle):.0f} |
| `DELETE … WHERE Inserted = <oldest kept day>` | {del_rows} | {delete_s} | {float(p99_delete):.0f} |
| `heatsink maintain --job rotate` (drops the expired day's partition), whole run | {drop_rows} | {drop_s} | {float(p99_drop):.0f} |
| of which the `ALTER TABLE … DROP PARTITION` | {drop_rows} | {ddl_s} | |

Dropping the day took 1/{float(delete_s) / float(ddl_s):.0f} of the time of deleting one (the
`ALTER` alone; the whole rotate run, with starting the process, reading the layout and
taking the lock: 1/{float(delete_s) / float(drop_s):.1f}).

Load average of the VM at the end of the run (1, 5, 15 min; the VM is shared, and
two cores run MariaDB, heatsink and the load generator): {load}.
""")
print(open(out).read())
PY
