#!/usr/bin/env bash
# The cost of the server's plan for a rollup read's column flags (`exact_flags`,
# docs/design.md "Column definitions"), through heatsink, in one run against one
# private MariaDB:
#   1. a `plays` log of ROWS rows (default 300000) over the last DAYS days (default 30),
#      TRACKS tracks (default 200; track 1 has a tenth of the plays), KEY (track_id),
#      KEY (created_at); a day rollup by track_id, hour rollup for the edges, both
#      made by `heatsink migrate --apply` (HEATSINK_BIN, default target/debug/heatsink).
#   2. two proxies on it: one with the rules as they are (`exact_flags` on), one with
#      `exact_flags = false`.
#   3. for each read of READS (scripts/lib/rollup_flags.py) whose flags depend on the
#      plan (a grouped column leading an index while a time range competes), at 1
#      connection, legs interleaved for ROUNDS rounds (default 5) of ITERS reads each
#      (default 400), p50 and mean latency per read as the client sees it:
#        exact, predicted, direct            the text read through each proxy, and sent
#                                            to the log
#        exact_ps, predicted_ps, direct_ps   the same prepared once and executed
#        explain, explain_json               EXPLAIN / EXPLAIN FORMAT=JSON of the read,
#                                            sent to MariaDB (what each format costs)
#      what EXPLAIN reports (key, Extra), and whether each side's column flags are the
#      server's.
# Writes bench/results/rollup-flags.md (OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-300000}
DAYS=${DAYS:-30}
TRACKS=${TRACKS:-200}
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-400}
OUT=${OUT:-bench/results/rollup-flags.md}
HEATSINK_BIN=${HEATSINK_BIN:-target/debug/heatsink}
export HEATSINK_BIN

[[ -x $HEATSINK_BIN ]] || cargo build --quiet --bin heatsink
python3 -c 'import pymysql' 2>/dev/null || { echo "needs python3 pymysql" >&2; exit 1; }
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
mariadb_start

mariadb_root -e "CREATE DATABASE logs; USE logs; CREATE TABLE plays (
  id BIGINT AUTO_INCREMENT PRIMARY KEY,
  created_at DATETIME DEFAULT NULL,
  track_id INT DEFAULT NULL,
  user_id INT DEFAULT NULL,
  country VARCHAR(255) DEFAULT NULL,
  KEY (track_id),
  KEY (created_at)
) ENGINE=InnoDB;
INSERT INTO plays (created_at, track_id, user_id, country)
SELECT NOW() - INTERVAL FLOOR(($ROWS - seq) * ($DAYS * 86400) / $ROWS) SECOND,
       IF(seq % 10 = 0, 1, 2 + FLOOR(RAND() * ($TRACKS - 1))),
       1 + FLOOR(RAND() * 100000),
       ELT(1 + FLOOR(RAND() * 5), 'US', 'DE', 'FR', 'BR', 'JP')
FROM seq_1_to_$ROWS;
ANALYZE TABLE plays;" >/dev/null

rules=""
hs_tmpdir_into rules rules-flags
cat >"$rules/rollup.toml" <<TOML
[[rollup]]
name = "plays_by_track_hour"
table = "logs.plays"
rollup_table = "logs.plays_by_track_hour"
time = "created_at"
bucket = "hour"
dimensions = ["track_id"]

[[rollup]]
name = "plays_by_track_day"
table = "logs.plays"
rollup_table = "logs.plays_by_track_day"
time = "created_at"
bucket = "day"
dimensions = ["track_id"]
TOML
url="mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$MARIADB_PORT/logs"
"$HEATSINK_BIN" migrate --rules "$rules" --backend-url "$url" --apply >/dev/null

predicted=""
hs_tmpdir_into predicted rules-predicted
sed 's/^dimensions = .*/&\nexact_flags = false/' "$rules/rollup.toml" >"$predicted/rollup.toml"
HS_RULES_DIR=$rules heatsink_start "$MARIADB_PORT"
exact_port=$HEATSINK_PORT
HS_RULES_DIR=$predicted heatsink_start "$MARIADB_PORT"
predicted_port=$HEATSINK_PORT

python3 scripts/lib/rollup_flags.py --port "$MARIADB_PORT" --exact-port "$exact_port" \
  --predicted-port "$predicted_port" --user "$SB_USER" --password "$SB_PASSWORD" \
  --rounds "$ROUNDS" --iters "$ITERS" --rows "$ROWS" --days "$DAYS" --tracks "$TRACKS" \
  --version "$MARIADB_VERSION" --commit "$(git rev-parse --short HEAD)" --out "$OUT"
hs_log "wrote $OUT"
