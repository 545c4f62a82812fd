#!/usr/bin/env bash
# Friends timelines, in one run against one private MariaDB: the published table
# rebuilt here — USERS users (default 10,000), each following ~43 others at random,
# MESSAGES messages (default "1000000 10000000": one data set after the other, the
# second grown from the first) by random authors — and for each size:
#   direct     the plain timeline query sent straight to MariaDB
#   pull       the same query through heatsink with a `[[timeline]]` rule, mode pull
# timelines/s at CONNS connections (default 8) for DURATION seconds (default 10),
# ROUNDS rounds interleaved (default 3, medians), random readers; submissions/s
# (single-row message inserts) directly and through heatsink (pull does not touch
# writes: the hop's cost); data size (information_schema). Checks before timing
# that heatsink's answers equal the plain query's for 200 readers.
# Writes bench/results/timeline.md (OUT). Quick check: MESSAGES=100000 DURATION=3.
set -euo pipefail
cd "$(dirname "$0")/.."
USERS=${USERS:-10000}
MESSAGES=${MESSAGES:-"1000000 10000000"}
CONNS=${CONNS:-8}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-bench/results/timeline.md}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
HEATSINK_BIN=${HEATSINK_BIN:-$TARGET_DIR/release/heatsink}
LOADGEN=${LOADGEN:-$TARGET_DIR/release/examples/loadgen}
export HEATSINK_BIN
MARIADB_EXTRA_ARGS=${MARIADB_EXTRA_ARGS:---innodb-buffer-pool-size=2G}
export MARIADB_EXTRA_ARGS

[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink --example loadgen
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
mariadb_start
db=$SB_DB
followees=$((USERS * 43))
mariadb_root "$db" -e "
  CREATE TABLE follower (user_id INT UNSIGNED NOT NULL, follower_id INT UNSIGNED NOT NULL,
    PRIMARY KEY (user_id, follower_id), KEY (follower_id));
  CREATE TABLE message (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, user_id INT UNSIGNED NOT NULL,
    body VARCHAR(255) NOT NULL, KEY user_id_id (user_id, id));
  INSERT IGNORE INTO follower SELECT 1 + seq DIV 43, 1 + FLOOR(RAND() * $USERS) FROM seq_0_to_$((followees - 1));"

rules=""
hs_tmpdir_into rules rules-timeline
cat >"$rules/timeline.toml" <<TOML
[[timeline]]
name = "friends"
messages = "message"
message_author = "user_id"
follows = "follower"
follow_reader = "user_id"
follow_author = "follower_id"
mode = "pull"
TOML
HS_RULES_DIR=$rules heatsink_start "$MARIADB_PORT"
url() { echo "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$1/$db"; }
Q="SELECT message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id WHERE follower.user_id = {rand:1:$USERS} ORDER BY message.id DESC LIMIT 20"
INS="INSERT INTO message (user_id, body) VALUES ({rand:1:$USERS}, 'hello')"
results=$(mktemp)
trap 'rm -f "$results"; hs_cleanup' EXIT

have=0
for n in $MESSAGES; do
  chunk=1000000
  while ((have < n)); do
    step=$((n - have < chunk ? n - have : chunk))
    mariadb_root "$db" -e "INSERT INTO message (user_id, body) SELECT 1 + FLOOR(RAND() * $USERS), CONCAT('message ', seq) FROM seq_1_to_$step"
    have=$((have + step))
  done
  mariadb_root "$db" -e "ANALYZE TABLE message, follower" >/dev/null
  size=$(mariadb_root -N -e "SELECT ROUND(SUM(DATA_LENGTH + INDEX_LENGTH) / 1048576, 1) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '$db'")
  hs_log "$n messages, $size MiB"
  # Same answers for 200 readers.
  python3 - "$MARIADB_PORT" "$HEATSINK_PORT" "$SB_USER" "$SB_PASSWORD" "$db" "$USERS" <<'PY'
import sys, pymysql
port_d, port_h, user, pw, db, users = sys.argv[1:7]
q = ("SELECT message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id "
     "WHERE follower.user_id = %s ORDER BY message.id DESC LIMIT 20")
d = pymysql.connect(host="127.0.0.1", port=int(port_d), user=user, password=pw, db=db)
h = pymysql.connect(host="127.0.0.1", port=int(port_h), user=user, password=pw, db=db)
for r in range(1, int(users) + 1, max(1, int(users) // 200)):
    a, b = d.cursor(), h.cursor()
    a.execute(q, (r,)); b.execute(q, (r,))
    assert a.fetchall() == b.fetchall(), r
PY
  for ((round = 1; round <= ROUNDS; round++)); do
    for leg in direct pull; do
      port=$MARIADB_PORT
      [[ $leg == pull ]] && port=$HEATSINK_PORT
      json=$(hs_run "$LOADGEN" --url "$(url "$port")" --json --label "$leg" -c "$CONNS" -d "$DURATION" --sql "$Q")
      printf '%s\t%s\tread\t%s\t%s\t%s\n' "$n" "$size" "$leg" "$round" "$json" >>"$results"
      hs_log "$n messages round $round $leg: $(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%.0f timelines/s p50 %.0f us errors %d" % (j["ops_per_sec"], j["p50_us"], j["errors"]))' "$json")"
    done
  done
  for leg in direct pull; do
    port=$MARIADB_PORT
    [[ $leg == pull ]] && port=$HEATSINK_PORT
    json=$(hs_run "$LOADGEN" --url "$(url "$port")" --json --label "$leg" -c "$CONNS" -d 5 --sql "$INS")
    printf '%s\t%s\twrite\t%s\t1\t%s\n' "$n" "$size" "$leg" "$json" >>"$results"
    have=$((have + $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ops"])' "$json")))
  done
done

python3 - "$results" "$OUT" "$USERS" "$CONNS" "$DURATION" "$ROUNDS" "$MARIADB_VERSION" <<'PY'
import json, statistics, sys, datetime, os, subprocess
res_p, out, users, conns, duration, rounds, version = sys.argv[1:8]
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
load = open("/proc/loadavg").read().split()[:3]
rows = {}
sizes = {}
for line in open(res_p):
    n, size, what, leg, rnd, js = line.rstrip("\n").split("\t", 5)
    rows.setdefault((int(n), what, leg), []).append(json.loads(js))
    sizes[int(n)] = size
med = lambda n, w, l, k="ops_per_sec": statistics.median(j[k] for j in rows[(n, w, l)])
lines = [
    "# Friends timelines: heatsink's timeline rule (pull)",
    "",
    f"- date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, heatsink {rev}; load average at the end {' '.join(load)}",
    f"- machine: {os.cpu_count()} cores; MariaDB {version}; client, proxy and server share the machine",
    f"- data: {int(users):,} users following ~43 others each at random; messages by random authors; the schema and"
    " query of the published benchmark (`follower (user_id, follower_id)`, `message (id, user_id, body)` with"
    " `KEY (user_id, id)`)",
    f"- timelines: `SELECT message.* FROM message INNER JOIN follower ON … WHERE follower.user_id = <random>"
    f" ORDER BY message.id DESC LIMIT 20` at {conns} connections, {duration} s per leg, {rounds} rounds interleaved,"
    " medians; submissions: single-row inserts, 5 s",
    "- heatsink's answers were checked equal to the plain query's for 200 readers before timing",
    "",
    "| messages | data MiB | direct timelines/s | pull timelines/s | **pull / direct** | per round | direct p50 µs | pull p50 µs | submissions/s direct | through heatsink |",
    "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
]
for n in sorted(sizes):
    d, p = med(n, "read", "direct"), med(n, "read", "pull")
    per = ", ".join(f"{a['ops_per_sec'] / b['ops_per_sec']:.1f}" for a, b in zip(rows[(n, "read", "pull")], rows[(n, "read", "direct")]))
    lines.append(f"| {n:,} | {sizes[n]} | {d:,.0f} | {p:,.0f} | **{p / d:.1f}** | {per} | {med(n, 'read', 'direct', 'p50_us'):,.0f} |"
                 f" {med(n, 'read', 'pull', 'p50_us'):,.0f} | {med(n, 'write', 'direct'):,.0f} | {med(n, 'write', 'pull'):,.0f} |")
lines += ["", "Goals: pull ≥ 5 × the plain query at 1M messages, ≥ 20 × at 10M. Push and hybrid are not built."]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
