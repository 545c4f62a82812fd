#!/usr/bin/env bash
# The push timeline's mailbox fill, before and after it went set-based, in one run
# against one private MariaDB.
#
# The graph: USERS users (default 3,000) each following ~FOLLOWS others at random
# (default 72: ~217k follow rows), MESSAGES messages (default 148,000) by random
# authors, a push rule with MAILBOX_SIZE (default 1,000) entries per reader. Legs,
# each on an emptied mailbox, ROUNDS rounds (default 1):
#   per-reader  the fill as `migrate` ran it before: one `INSERT IGNORE … SELECT`
#               per reader (the pull read's bound), the readers in order, over one
#               connection (run from Python: the statement is the server's work)
#   chunk=N     `heatsink migrate --apply --chunk N` (the fill job: N readers per
#               `INSERT IGNORE … SELECT` ranked with DENSE_RANK, each chunk one
#               transaction with its progress row), for N in CHUNKS (default
#               "20 100 500")
# Each leg's mailbox is checked equal (count and checksum) to the first's. Writes
# bench/results/mailbox-fill.md (OUT). Quick check: USERS=300 MESSAGES=15000.
set -euo pipefail
cd "$(dirname "$0")/.."
USERS=${USERS:-3000}
FOLLOWS=${FOLLOWS:-72}
MESSAGES=${MESSAGES:-148000}
MAILBOX_SIZE=${MAILBOX_SIZE:-1000}
CHUNKS=${CHUNKS:-"20 100 500"}
ROUNDS=${ROUNDS:-1}
OUT=${OUT:-bench/results/mailbox-fill.md}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
HEATSINK_BIN=${HEATSINK_BIN:-$TARGET_DIR/release/heatsink}
export HEATSINK_BIN
MARIADB_EXTRA_ARGS=${MARIADB_EXTRA_ARGS:---innodb-buffer-pool-size=1G}
export MARIADB_EXTRA_ARGS

[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
mariadb_start
db=$SB_DB
url="mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$MARIADB_PORT/$db"

mariadb_root "$db" -e "CREATE TABLE follower (user_id INT UNSIGNED NOT NULL, follower_id INT UNSIGNED NOT NULL,
    PRIMARY KEY (user_id, follower_id), KEY (follower_id));
  CREATE TABLE message (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, user_id INT UNSIGNED NOT NULL,
    body VARCHAR(255) NOT NULL, KEY user_id_id (user_id, id));
  INSERT IGNORE INTO follower SELECT 1 + seq DIV $FOLLOWS, 1 + FLOOR(RAND(1) * $USERS)
    FROM seq_0_to_$((USERS * FOLLOWS - 1));
  INSERT INTO message (user_id, body) SELECT 1 + FLOOR(RAND(2) * $USERS), 'hello'
    FROM seq_1_to_$MESSAGES;
  ANALYZE TABLE follower, message;"
follows=$(mariadb_root -N "$db" -e "SELECT COUNT(*) FROM follower")
messages=$(mariadb_root -N "$db" -e "SELECT COUNT(*) FROM message")
hs_log "graph: $USERS users, $follows follows, $messages messages"

rules=""
hs_tmpdir_into rules rules
printf '[[timeline]]\nname = "friends"\nmessages = "message"\nmessage_author = "user_id"\nfollows = "follower"\nfollow_reader = "user_id"\nfollow_author = "follower_id"\nmode = "push"\nmailbox = "mailbox"\nmailbox_size = %s\n' \
  "$MAILBOX_SIZE" >"$rules/timeline.toml"
# The mailbox and its triggers, the fill deferred.
"$HEATSINK_BIN" migrate --rules "$rules" --backend-url "$url" --apply --defer-jobs >/dev/null

empty() { mariadb_root "$db" -e "TRUNCATE TABLE mailbox; DELETE FROM heatsink_jobs"; }
sum() { mariadb_root -N "$db" -e "SELECT CONCAT(COUNT(*), ' ', IFNULL(SUM(CRC32(CONCAT_WS(',', hs_reader, hs_message, hs_author))), 0)) FROM mailbox"; }
now() { date +%s.%N; }

# The per-reader statement of the fill before (the pull read's bound per reader).
per_reader() {
  python3 - "$MARIADB_PORT" "$SB_USER" "$SB_PASSWORD" "$db" "$MAILBOX_SIZE" <<'PY'
import sys, pymysql
port, user, pw, db, size = sys.argv[1:6]
size = int(size)
last = size - 1
sql = (
    "INSERT IGNORE INTO mailbox (hs_reader, hs_message, hs_author) SELECT hs_f.user_id, hs_m.id, hs_m.user_id "
    "FROM (SELECT COALESCE((SELECT hs_x.hs_mx FROM (SELECT (SELECT hs_m2.id FROM message AS hs_m2 "
    "WHERE hs_m2.user_id = hs_f2.follower_id ORDER BY hs_m2.id DESC LIMIT 1) AS hs_mx FROM follower AS hs_f2 WHERE hs_f2.user_id = %s "
    f"ORDER BY hs_mx DESC LIMIT 1 OFFSET {last}) AS hs_x), "
    "(SELECT MAX(hs_y.hs_k) FROM (SELECT (SELECT hs_m2.id FROM message AS hs_m2 "
    f"WHERE hs_m2.user_id = hs_f2.follower_id ORDER BY hs_m2.id DESC LIMIT 1 OFFSET {last}) AS hs_k "
    "FROM follower AS hs_f2 WHERE hs_f2.user_id = %s) AS hs_y), 0) AS hs_t) AS hs_t, "
    "follower AS hs_f STRAIGHT_JOIN message AS hs_m ON hs_m.user_id = hs_f.follower_id "
    f"WHERE hs_f.user_id = %s AND hs_m.id >= hs_t.hs_t ORDER BY hs_m.id DESC LIMIT {size}"
)
c = pymysql.connect(host="127.0.0.1", port=int(port), user=user, password=pw, db=db, autocommit=True)
cur = c.cursor()
cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
cur.execute("SELECT DISTINCT user_id FROM follower ORDER BY user_id")
for (r,) in cur.fetchall():
    cur.execute(sql, (r, r, r))
PY
}

results=$(mktemp)
trap 'rm -f "$results"; hs_cleanup' EXIT
ref=""
for ((round = 1; round <= ROUNDS; round++)); do
  empty
  t0=$(now)
  per_reader
  t1=$(now)
  s=$(sum)
  [[ -z $ref ]] && ref=$s
  [[ $s == "$ref" ]] || hs_die "per-reader mailbox differs: $s vs $ref"
  printf 'per-reader\t%s\t%s\t%s\n' "$round" "$(python3 -c "print($t1 - $t0)")" "$s" >>"$results"
  hs_log "round $round per-reader: $(python3 -c "print('%.1f s' % ($t1 - $t0))") ($s)"
  for n in $CHUNKS; do
    empty
    t0=$(now)
    "$HEATSINK_BIN" migrate --rules "$rules" --backend-url "$url" --apply --chunk "$n" >/dev/null 2>&1
    t1=$(now)
    s=$(sum)
    [[ $s == "$ref" ]] || hs_die "chunk=$n mailbox differs: $s vs $ref"
    printf 'chunk=%s\t%s\t%s\t%s\n' "$n" "$round" "$(python3 -c "print($t1 - $t0)")" "$s" >>"$results"
    hs_log "round $round chunk=$n: $(python3 -c "print('%.1f s' % ($t1 - $t0))")"
  done
done

entries=${ref%% *}
load=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$results" "$OUT" "$USERS" "$follows" "$messages" "$MAILBOX_SIZE" "$entries" "$MARIADB_VERSION" "$load" "$HEATSINK_BIN" <<'PY'
import sys, statistics, subprocess, datetime
res, out, users, follows, messages, size, entries, version, load, binary = sys.argv[1:11]
legs = {}
for line in open(res):
    leg, rnd, secs, _ = line.rstrip("\n").split("\t")
    legs.setdefault(leg, []).append(float(secs))
base = statistics.median(legs["per-reader"])
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
rows = []
for leg, secs in legs.items():
    m = statistics.median(secs)
    rows.append(f"| {leg} | {m:.1f} | {int(users) / m:,.0f} | {int(entries) / m:,.0f} | **{base / m:.1f}** |")
with open(out, "w") as f:
    f.write(f"""# The push timeline's mailbox fill: per reader, and in chunks of readers

- date: {now}, heatsink {commit} ({binary}); load average at the end {load}
- machine: 2 cores shared with other builds and tests; MariaDB {version}; client and server share the machine
- graph: {int(users):,} users, {int(follows):,} follows (random), {int(messages):,} messages (random authors); `mailbox_size = {size}`: {int(entries):,} mailbox entries when filled
- legs, each on an emptied mailbox, one round, ratios from this one run: **per-reader**, the fill as `migrate` ran it before (one `INSERT IGNORE … SELECT` per reader, run from Python over one connection: the statement is the server's work); **chunk=N**, `heatsink migrate --apply --chunk N` (the `fill` job: N readers per statement, each chunk one transaction with its progress row; the whole command timed)
- every leg's mailbox was checked equal (count and checksum) to the per-reader one

| leg | seconds | readers/s | entries/s | **speed-up over per-reader** |
|---|---:|---:|---:|---:|
""" + "\n".join(rows) + "\n")
print(open(out).read())
PY
