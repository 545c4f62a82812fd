#!/usr/bin/env bash
# Connection set-up cost of session state tracking: a client that connects, runs one
# statement and disconnects (PHP-style, no pool), N times, through
#   direct     MariaDB itself
#   plain      heatsink with a counter rule that does not merge (coalesce = false):
#              no tracking set-up
#   tracking   heatsink with the same rule merging (the default): after
#              authentication each session runs `SET SESSION session_track_… ` on
#              its own connection (relay::state::TRACKING_SETUP)
# with PyMySQL (no CLIENT_SESSION_TRACK) and mysql_async-like clients that ask for it
# are not distinguished here. ROUNDS interleaved rounds (default 3), N connections
# per leg (default 1000). Writes bench/results/connect.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
N=${N:-1000}
OUT=bench/results/connect.md

[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
mariadb_start
db=$SB_DB
mariadb_root "$db" -e "
  CREATE TABLE hits (slug VARCHAR(64) NOT NULL PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB;
  INSERT INTO hits VALUES ('hot', 0);"

rule() {
	printf '[[counter]]\nname = "hot"\ntable = "hits"\nkey = ["slug"]\ncolumns = ["cnt"]\nslots = 16\nslot_table = "hits_slots"\ncoalesce = %s\n' "$1"
}
rules_plain=""; rules_track=""
hs_tmpdir_into rules_plain rules-plain
hs_tmpdir_into rules_track rules-track
rule false >"$rules_plain/c.toml"
rule true >"$rules_track/c.toml"
"${HEATSINK_BIN:-target/release/heatsink}" migrate --apply --rules "$rules_track" \
	--backend-url "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$MARIADB_PORT/$db" >/dev/null

HS_RULES_DIR=$rules_plain heatsink_start "$MARIADB_PORT"
plain_port=$HEATSINK_PORT
HS_RULES_DIR=$rules_track heatsink_start "$MARIADB_PORT"
track_port=$HEATSINK_PORT

leg() { # PORT -> connections per second
	python3 - "$1" "$N" "$SB_USER" "$SB_PASSWORD" "$db" <<'PY'
import sys, time, pymysql
port, n, user, pw, db = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
t = time.perf_counter()
for _ in range(n):
    c = pymysql.connect(host="127.0.0.1", port=port, user=user, password=pw, database=db)
    with c.cursor() as cur:
        cur.execute("SELECT cnt FROM hits WHERE slug = 'hot'")
        cur.fetchall()
    c.close()
print(f"{n / (time.perf_counter() - t):.1f}")
PY
}

declare -A res
for ((r = 1; r <= ROUNDS; r++)); do
	for name in direct plain tracking; do
		case $name in
		direct) port=$MARIADB_PORT ;;
		plain) port=$plain_port ;;
		tracking) port=$track_port ;;
		esac
		v=$(leg "$port")
		res[$name,$r]=$v
		hs_log "round $r $name: $v connections/s"
	done
done

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
row() {
	local name=$1 vals=() r
	for ((r = 1; r <= ROUNDS; r++)); do vals+=("${res[$name,$r]}"); done
	echo "${vals[*]}"
}
m_direct=$(median $(row direct))
m_plain=$(median $(row plain))
m_track=$(median $(row tracking))
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
{
	echo "# Connection set-up with session state tracking"
	echo
	echo "\`scripts/bench-connect.sh\`, $(date -u +%Y-%m-%d), $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)."
	echo "PyMySQL, connect + one point select + close, $N connections per leg, $ROUNDS interleaved rounds."
	echo
	echo "| leg | connections/s (median) | per round | / plain |"
	echo "|---|---:|---|---:|"
	echo "| direct | $m_direct | $(row direct) | $(ratio "$m_direct" "$m_plain") |"
	echo "| heatsink, rule without merging (no tracking set-up) | $m_plain | $(row plain) | 1.000 |"
	echo "| heatsink, merging rule (tracking set up per session) | $m_track | $(row tracking) | $(ratio "$m_track" "$m_plain") |"
	echo
	echo "The tracking set-up is one more statement per connection on the session's own backend"
	echo "connection (two for a client that negotiated CLIENT_SESSION_TRACK itself); a pooled"
	echo "client pays it once per connection and again after each COM_RESET_CONNECTION."
} >"$OUT"
cat "$OUT"
