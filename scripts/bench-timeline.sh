#!/usr/bin/env bash
# Friends timelines, in one run against one private MariaDB.
#
# (a) The published table rebuilt here — USERS users (default 10,000), each following
#     ~43 others at random, MESSAGES messages (default "1000000 10000000": one data
#     set after the other, the second grown from the first) by random authors — and
#     for each size, timelines/s at CONNS connections (default 8) for DURATION seconds
#     (default 10), ROUNDS rounds interleaved (default 3, medians), random readers:
#       direct   the plain timeline query sent straight to MariaDB
#       pull     the same query through heatsink, a `[[timeline]]` rule in mode pull
#       push     through a second heatsink, mode push (mailbox `mailbox_push`)
#       hybrid   through a third, mode hybrid (mailbox `mailbox_hybrid`)
#     Both mailboxes are filled by `heatsink migrate --apply` (MAILBOX_SIZE entries
#     per reader, default 100). Submissions/s (single-row message inserts, 5 s) for
#     each leg with only that leg's triggers on the tables; data size per mode.
# (b) A heavy-tailed graph in a second database: STARS authors (default 10) each
#     followed by a quarter of all users, on top of the ~43 random followees; STAR_SHARE
#     percent (default 10) of the messages (HEAVY_MESSAGES, default 1,000,000) and of
#     the submissions by those authors. Push against hybrid (fanout_limit 1000):
#     timelines/s and submissions/s.
# Checks before timing that every leg's answers equal the plain query's for 200
# readers. Writes bench/results/timeline.md (OUT). Quick check: MESSAGES=100000
# HEAVY_MESSAGES=100000 DURATION=3 ROUNDS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
USERS=${USERS:-10000}
MESSAGES=${MESSAGES:-"1000000 10000000"}
HEAVY_MESSAGES=${HEAVY_MESSAGES:-1000000}
STARS=${STARS:-10}
STAR_SHARE=${STAR_SHARE:-10}
MAILBOX_SIZE=${MAILBOX_SIZE:-100}
CONNS=${CONNS:-8}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-bench/results/timeline.md}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
HEATSINK_BIN=${HEATSINK_BIN:-$TARGET_DIR/release/heatsink}
LOADGEN=${LOADGEN:-$TARGET_DIR/release/examples/loadgen}
export HEATSINK_BIN
MARIADB_EXTRA_ARGS=${MARIADB_EXTRA_ARGS:---innodb-buffer-pool-size=3G}
export MARIADB_EXTRA_ARGS

[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink --example loadgen
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
mariadb_start
db=$SB_DB
heavy=${SB_DB}_heavy
url() { echo "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$1/$2"; }

schema="CREATE TABLE follower (user_id INT UNSIGNED NOT NULL, follower_id INT UNSIGNED NOT NULL,
    PRIMARY KEY (user_id, follower_id), KEY (follower_id));
  CREATE TABLE message (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, user_id INT UNSIGNED NOT NULL,
    body VARCHAR(255) NOT NULL, KEY user_id_id (user_id, id));"
followees=$((USERS * 43))
mariadb_root -e "CREATE DATABASE IF NOT EXISTS $heavy"
mariadb_root "$db" -e "$schema
  INSERT IGNORE INTO follower SELECT 1 + seq DIV 43, 1 + FLOOR(RAND() * $USERS) FROM seq_0_to_$((followees - 1));"
# Heavy-tailed: authors 1..STARS are each followed by a quarter of the users.
mariadb_root "$heavy" -e "$schema
  INSERT IGNORE INTO follower SELECT 1 + seq DIV 43, 1 + FLOOR(RAND() * $USERS) FROM seq_0_to_$((followees - 1));
  INSERT IGNORE INTO follower SELECT s.seq, k.seq FROM seq_1_to_$USERS s, seq_1_to_$STARS k WHERE RAND() < 0.25;"

# rules_for MODE MAILBOX DIR: one timeline rule in DIR.
rules_for() {
  local dir=$3
  {
    printf '[[timeline]]\nname = "friends"\nmessages = "message"\nmessage_author = "user_id"\n'
    printf 'follows = "follower"\nfollow_reader = "user_id"\nfollow_author = "follower_id"\nmode = "%s"\n' "$1"
    if [[ $1 != pull ]]; then
      printf 'mailbox = "%s"\nmailbox_size = %s\nfanout_limit = 1000\n' "$2" "$MAILBOX_SIZE"
    fi
  } >"$dir/timeline.toml"
}
logs=""
hs_tmpdir_into logs timeline-logs
declare -A RULES PORT
for mode in pull push hybrid; do
  dir=""
  hs_tmpdir_into dir "rules-$mode"
  rules_for "$mode" "mailbox_$mode" "$dir"
  RULES[$mode]=$dir
  HS_RULES_DIR=${RULES[$mode]} heatsink_start "$MARIADB_PORT"
  PORT[$mode]=$HEATSINK_PORT
done
PORT[direct]=$MARIADB_PORT

# migrate MODE DB: creates the mode's mailbox and triggers and fills the mailboxes.
migrate() {
  local t0 t1
  t0=$(date +%s.%N)
  "$HEATSINK_BIN" migrate --rules "${RULES[$1]}" --backend-url "$(url "$MARIADB_PORT" "$2")" --apply >"$logs/migrate-$1-$2.log" 2>&1 ||
    { cat "$logs/migrate-$1-$2.log" >&2; hs_die "migrate $1 failed"; }
  t1=$(date +%s.%N)
  hs_log "migrate $1 in $2: $(python3 -c "print('%.1f s' % ($t1 - $t0))")"
}
# unmigrate MODE DB: drops the mode's triggers and empties its mailbox.
unmigrate() {
  local t
  for t in msg_ins msg_upd msg_del fol_ins fol_upd fol_del; do
    mariadb_root "$2" -e "DROP TRIGGER IF EXISTS mailbox_$1_hs_$t"
  done
  mariadb_root "$2" -e "TRUNCATE TABLE mailbox_$1" 2>/dev/null || true
}
mb_size() {
  mariadb_root "$1" -e "ANALYZE TABLE ${2//\'/}" >/dev/null 2>&1 || true
  mariadb_root -N -e "SELECT IFNULL(ROUND(SUM(DATA_LENGTH + INDEX_LENGTH) / 1048576, 1), 0) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '$1' AND TABLE_NAME IN ($2)"
}

Q="SELECT message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id WHERE follower.user_id = {rand:1:$USERS} ORDER BY message.id DESC LIMIT 20"
INS="INSERT INTO message (user_id, body) VALUES ({rand:1:$USERS}, 'hello')"
# Heavy: STAR_SHARE percent of the submissions by the popular authors.
INS_HEAVY="INSERT INTO message (user_id, body) VALUES (IF(RAND() * 100 < $STAR_SHARE, 1 + FLOOR(RAND() * $STARS), {rand:1:$USERS}), 'hello')"
results=$(mktemp)
trap 'rm -f "$results"; hs_cleanup' EXIT

# same DB LEGS...: the legs' answers equal the plain query's for 200 readers.
same() {
  local d=$1
  shift
  local ports=()
  for leg in "$@"; do ports+=("${PORT[$leg]}"); done
  python3 - "$MARIADB_PORT" "$SB_USER" "$SB_PASSWORD" "$d" "$USERS" "${ports[@]}" <<'PY'
import sys, pymysql
port_d, user, pw, db, users = sys.argv[1:6]
q = ("SELECT message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id "
     "WHERE follower.user_id = %s ORDER BY message.id DESC LIMIT 20")
conns = [pymysql.connect(host="127.0.0.1", port=int(p), user=user, password=pw, db=db) for p in [port_d] + sys.argv[6:]]
for r in range(1, int(users) + 1, max(1, int(users) // 200)):
    answers = []
    for c in conns:
        cur = c.cursor()
        cur.execute(q, (r,))
        answers.append(cur.fetchall())
    assert all(a == answers[0] for a in answers), r
PY
}

# reads TAG DB LEGS...: ROUNDS interleaved rounds of timelines.
reads() {
  local tag=$1 d=$2 round leg json
  shift 2
  for ((round = 1; round <= ROUNDS; round++)); do
    for leg in "$@"; do
      json=$(hs_run "$LOADGEN" --url "$(url "${PORT[$leg]}" "$d")" --json --label "$leg" -c "$CONNS" -d "$DURATION" --sql "$Q")
      printf '%s\tread\t%s\t%s\t%s\n' "$tag" "$leg" "$round" "$json" >>"$results"
      hs_log "$tag round $round $leg: $(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%.0f timelines/s p50 %.0f us errors %d" % (j["ops_per_sec"], j["p50_us"], j["errors"]))' "$json")"
    done
  done
}

# writes TAG DB LEG SQL: submissions for 5 s; returns the count in $wrote.
writes() {
  local json
  json=$(hs_run "$LOADGEN" --url "$(url "${PORT[$3]}" "$2")" --json --label "$3" -c "$CONNS" -d 5 --sql "$4")
  printf '%s\twrite\t%s\t1\t%s\n' "$1" "$3" "$json" >>"$results"
  wrote=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ops"])' "$json")
  hs_log "$1 $3 submissions: $(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%.0f/s errors %d" % (j["ops_per_sec"], j["errors"]))' "$json")"
}

# fill DB N: messages by random authors (STAR_SHARE percent by the stars when $3).
fill() {
  local d=$1 n=$2 stars=${3:-0} step chunk=1000000 author
  author="1 + FLOOR(RAND() * $USERS)"
  ((stars)) && author="IF(RAND() * 100 < $STAR_SHARE, 1 + FLOOR(RAND() * $STARS), 1 + FLOOR(RAND() * $USERS))"
  while ((n > 0)); do
    step=$((n < chunk ? n : chunk))
    mariadb_root "$d" -e "INSERT INTO message (user_id, body) SELECT $author, CONCAT('message ', seq) FROM seq_1_to_$step"
    n=$((n - step))
  done
  mariadb_root "$d" -e "ANALYZE TABLE message, follower" >/dev/null
}

# (a) the published table, at each size.
have=0
for n in $MESSAGES; do
  unmigrate push "$db"
  unmigrate hybrid "$db"
  fill "$db" $((n - have))
  have=$n
  base=$(mb_size "$db" "'message', 'follower'")
  migrate push "$db"
  migrate hybrid "$db"
  printf '%s\tsize\t-\t1\t{"base": %s, "push": %s, "hybrid": %s}\n' "$n" "$base" \
    "$(mb_size "$db" "'mailbox_push'")" "$(mb_size "$db" "'mailbox_hybrid'")" >>"$results"
  hs_log "$n messages: $base MiB, mailboxes $(mb_size "$db" "'mailbox_push'") / $(mb_size "$db" "'mailbox_hybrid'") MiB"
  same "$db" pull push hybrid
  reads "$n" "$db" direct pull push hybrid
  # Submissions with only the leg's triggers on the tables (the mailboxes keep what
  # they hold: inserts alone never leave an entry off its timeline).
  unmigrate hybrid "$db"
  writes "$n" "$db" push "$INS"
  have=$((have + wrote))
  unmigrate push "$db"
  writes "$n" "$db" direct "$INS"
  have=$((have + wrote))
  writes "$n" "$db" pull "$INS"
  have=$((have + wrote))
  migrate hybrid "$db"
  writes "$n" "$db" hybrid "$INS"
  have=$((have + wrote))
done
unmigrate push "$db"
unmigrate hybrid "$db"

# (b) the heavy-tailed graph.
fill "$heavy" "$HEAVY_MESSAGES" 1
migrate push "$heavy"
migrate hybrid "$heavy"
printf 'heavy\tsize\t-\t1\t{"base": %s, "push": %s, "hybrid": %s}\n' "$(mb_size "$heavy" "'message', 'follower'")" \
  "$(mb_size "$heavy" "'mailbox_push'")" "$(mb_size "$heavy" "'mailbox_hybrid'")" >>"$results"
same "$heavy" push hybrid
reads heavy "$heavy" push hybrid
unmigrate hybrid "$heavy"
writes heavy "$heavy" push "$INS_HEAVY"
unmigrate push "$heavy"
migrate hybrid "$heavy"
writes heavy "$heavy" hybrid "$INS_HEAVY"
star_followers=$(mariadb_root -N "$heavy" -e "SELECT ROUND(AVG(n)) FROM (SELECT COUNT(*) n FROM follower WHERE follower_id <= $STARS GROUP BY follower_id) x")

python3 - "$results" "$OUT" "$USERS" "$CONNS" "$DURATION" "$ROUNDS" "$MARIADB_VERSION" "$MAILBOX_SIZE" "$STARS" "$STAR_SHARE" "$star_followers" "$HEAVY_MESSAGES" <<'PY'
import json, statistics, sys, datetime, os, subprocess
(res_p, out, users, conns, duration, rounds, version, mbsize, stars, share, star_followers,
 heavy_n) = sys.argv[1:13]
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
load = open("/proc/loadavg").read().split()[:3]
rows, sizes = {}, {}
for line in open(res_p):
    tag, what, leg, rnd, js = line.rstrip("\n").split("\t", 4)
    if what == "size":
        sizes[tag] = json.loads(js)
        continue
    rows.setdefault((tag, what, leg), []).append(json.loads(js))
med = lambda t, w, l, k="ops_per_sec": statistics.median(j[k] for j in rows[(t, w, l)])
per = lambda t, a, b: ", ".join(f"{x['ops_per_sec'] / y['ops_per_sec']:.1f}" for x, y in zip(rows[(t, "read", a)], rows[(t, "read", b)]))
lines = [
    "# Friends timelines: heatsink's timeline rule (pull, push, hybrid)",
    "",
    f"- date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, heatsink {rev}; load average at the end {' '.join(load)}",
    f"- machine: {os.cpu_count()} cores; MariaDB {version}; client, proxies and server share the machine",
    f"- data: {int(users):,} users following ~43 others each at random; messages by random authors; the schema and"
    " query of the published benchmark (`follower (user_id, follower_id)`, `message (id, user_id, body)` with"
    " `KEY (user_id, id)`)",
    f"- timelines: `SELECT message.* FROM message INNER JOIN follower ON … WHERE follower.user_id = <random>"
    f" ORDER BY message.id DESC LIMIT 20` at {conns} connections, {duration} s per leg, {rounds} rounds interleaved,"
    " medians; submissions: single-row inserts at the same connections, 5 s, with only the leg's triggers on the tables",
    f"- push and hybrid: mailboxes filled by `heatsink migrate --apply`, `mailbox_size = {mbsize}`, `fanout_limit = 1000`;"
    " three proxies, one per mode; every leg's answers were checked equal to the plain query's for 200 readers before timing",
    "",
    "## (a) The published table",
    "",
    "| messages | data MiB (+ mailbox push / hybrid) | direct timelines/s | pull | push | hybrid | **pull / direct** | **push / direct** | **hybrid / direct** | pull / direct per round | p50 µs direct / pull / push / hybrid | submissions/s direct | pull | push | hybrid |",
    "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|",
]
for tag in sorted((t for t in sizes if t != "heavy"), key=int):
    d = med(tag, "read", "direct")
    r = {leg: med(tag, "read", leg) for leg in ("pull", "push", "hybrid")}
    p50 = " / ".join(f"{med(tag, 'read', leg, 'p50_us'):,.0f}" for leg in ("direct", "pull", "push", "hybrid"))
    w = {leg: med(tag, "write", leg) for leg in ("direct", "pull", "push", "hybrid")}
    s = sizes[tag]
    lines.append(f"| {int(tag):,} | {s['base']} (+ {s['push']} / {s['hybrid']}) | {d:,.0f} | {r['pull']:,.0f} | {r['push']:,.0f} | {r['hybrid']:,.0f} |"
                 f" **{r['pull'] / d:.1f}** | **{r['push'] / d:.1f}** | **{r['hybrid'] / d:.1f}** | {per(tag, 'pull', 'direct')} | {p50} |"
                 f" {w['direct']:,.0f} | {w['pull']:,.0f} | {w['push']:,.0f} | {w['hybrid']:,.0f} |")
lines += ["", "Goals: pull ≥ 5 × the plain query at 1M messages, ≥ 20 × at 10M.", ""]
if "heavy" in sizes:
    s = sizes["heavy"]
    rp, rh = med("heavy", "read", "push"), med("heavy", "read", "hybrid")
    wp, wh = med("heavy", "write", "push"), med("heavy", "write", "hybrid")
    lines += [
        "## (b) A heavy-tailed graph",
        "",
        f"{int(heavy_n):,} messages; authors 1–{stars} each followed by ~{star_followers} users (a quarter), on top of"
        f" the ~43 random followees; {share} % of the messages and of the submissions by those authors.",
        "",
        "| data MiB (+ mailbox push / hybrid) | push timelines/s | hybrid timelines/s | **hybrid / push (reads)** | per round | push submissions/s | hybrid submissions/s | **hybrid / push (submissions)** |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
        f"| {s['base']} (+ {s['push']} / {s['hybrid']}) | {rp:,.0f} | {rh:,.0f} | **{rh / rp:.2f}** | {per('heavy', 'hybrid', 'push')} | {wp:,.0f} | {wh:,.0f} | **{wh / wp:.1f}** |",
        "",
        "Goals: hybrid ≥ 0.8 × push's timelines/s with ≥ 3 × push's submissions/s.",
    ]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
