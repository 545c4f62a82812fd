#!/usr/bin/env bash
# Passthrough overhead of heatsink (empty rules dir) against MariaDB directly and
# against haproxy in TCP mode, all measured in the same run.
#
#   scripts/bench-passthrough.sh
#
# Environment:
#   DURATION=10      seconds per sysbench measurement
#   ROUNDS=3         rounds; each round runs every leg once, legs rotated per round
#   LAT_DURATION=5   seconds per 1-connection loadgen latency measurement
#   RW_DURATION=10   seconds of oltp_read_write (direct and through heatsink)
#   SKIP_BUILD=1     do not run cargo build
#   LOADGEN, HEATSINK_BIN   override the binaries (default: target/release/...)
#   OUT=bench/results/passthrough.md   where the Markdown report goes
#
# Everything started here (mariadbd, heatsink, haproxy) is stopped by pid on exit,
# failure or Ctrl-C, and the temp dirs are removed.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/mariadb.sh
source "$SCRIPT_DIR/lib/mariadb.sh"
cd "$HS_REPO_DIR"

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
LAT_DURATION=${LAT_DURATION:-5}
RW_DURATION=${RW_DURATION:-10}
OUT=${OUT:-bench/results/passthrough.md}
TABLES=4
TABLE_SIZE=10000
LEGS=(direct heatsink haproxy)
LOADGEN=${LOADGEN:-$HS_REPO_DIR/target/release/examples/loadgen}
LAT_SQL="SELECT c FROM sbtest1 WHERE id={rand:1:$TABLE_SIZE}"

hs_install_traps

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
	hs_log "building (cargo build --release --bin heatsink --example loadgen)"
	cargo build --release --bin heatsink --example loadgen
fi
[[ -x "$LOADGEN" ]] || hs_die "loadgen not built: $LOADGEN"

hs_tmpdir_into WORK bench
RAW=$WORK/raw.tsv # leg  metric  round  value
: >"$RAW"
FAILURES=0

mariadb_start
heatsink_start "$MARIADB_PORT"
haproxy_start "$MARIADB_PORT"

leg_port() {
	case $1 in
	direct) echo "$MARIADB_PORT" ;;
	heatsink) echo "$HEATSINK_PORT" ;;
	haproxy) echo "$HAPROXY_PORT" ;;
	*) hs_die "unknown leg $1" ;;
	esac
}

sb() { # sb TEST PORT ARGS...
	local test=$1 port=$2
	shift 2
	hs_run sysbench "$test" --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$port" \
		--mysql-user="$SB_USER" --mysql-password="$SB_PASSWORD" --mysql-db="$SB_DB" \
		--tables=$TABLES --table-size=$TABLE_SIZE "$@"
}

# sb_field FILE NAME -> a number from sysbench's report.
#   qps, tps: the "(N per sec.)" of queries / transactions
#   avg_ms, p95_ms: latency; errors, reconnects: ignored errors / reconnects counts
sb_field() {
	local file=$1 name=$2
	case $name in
	qps) sed -n 's/^ *queries: .*(\([0-9.]*\) per sec.)/\1/p' "$file" ;;
	tps) sed -n 's/^ *transactions: .*(\([0-9.]*\) per sec.)/\1/p' "$file" ;;
	avg_ms) sed -n 's/^ *avg: *\([0-9.]*\)/\1/p' "$file" ;;
	p95_ms) sed -n 's/^ *95th percentile: *\([0-9.]*\)/\1/p' "$file" ;;
	errors) sed -n 's/^ *ignored errors: *\([0-9]*\) .*/\1/p' "$file" ;;
	reconnects) sed -n 's/^ *reconnects: *\([0-9]*\) .*/\1/p' "$file" ;;
	esac | sed -n 1p # sed reads all input: no SIGPIPE under pipefail
}

innodb_deadlocks() {
	mariadb_root -N -e "SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'" | awk '{print $2}'
}

record() { printf '%s\t%s\t%s\t%s\n' "$@" >>"$RAW"; }

# A leg failed: note it and go on, so one broken leg still leaves a report.
leg_failed() {
	hs_log "FAILED: $*"
	FAILURES=$((FAILURES + 1))
	record "$1" failure "$2" "$3"
}

check_alive() {
	if [[ -n "${HEATSINK_PID:-}" ]] && ! kill -0 "$HEATSINK_PID" 2>/dev/null; then
		tail -n 50 "$HEATSINK_LOG" >&2 || true
		hs_die "heatsink died (log above)"
	fi
}

run_point_select() { # leg threads round
	local leg=$1 threads=$2 round=$3 port log
	port=$(leg_port "$leg")
	log=$WORK/ps-$leg-$threads-$round.log
	if ! sb oltp_point_select "$port" --threads="$threads" --time="$DURATION" \
		--report-interval=0 run >"$log" 2>&1; then
		tail -n 20 "$log" >&2
		leg_failed "$leg" "$round" "sysbench point_select ${threads}t exited non-zero"
		return 0
	fi
	local qps avg p95 errs
	qps=$(sb_field "$log" qps)
	avg=$(sb_field "$log" avg_ms)
	p95=$(sb_field "$log" p95_ms)
	errs=$(sb_field "$log" errors)
	record "$leg" "ps${threads}_qps" "$round" "$qps"
	record "$leg" "ps${threads}_avg_ms" "$round" "$avg"
	record "$leg" "ps${threads}_p95_ms" "$round" "$p95"
	record "$leg" "ps${threads}_errors" "$round" "${errs:-0}"
	hs_log "  $leg ${threads}t: $qps qps, avg ${avg} ms, p95 ${p95} ms, errors ${errs:-?}"
}

run_latency() { # leg round
	local leg=$1 round=$2 port log
	port=$(leg_port "$leg")
	log=$WORK/lg-$leg-$round.log
	if ! hs_run "$LOADGEN" --url "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$port/$SB_DB" \
		--connections 1 --warmup 1 --duration "$LAT_DURATION" --prepared --json \
		--label "$leg" --sql "$LAT_SQL" >"$log" 2>&1; then
		cat "$log" >&2
		leg_failed "$leg" "$round" "loadgen exited non-zero"
		return 0
	fi
	local line
	line=$(grep '^{' "$log" | tail -n 1)
	record "$leg" lg1_json "$round" "$line"
	hs_log "  $leg loadgen 1c: $line"
}

# --- data -------------------------------------------------------------------
hs_log "sysbench prepare ($TABLES tables x $TABLE_SIZE rows)"
sb oltp_point_select "$MARIADB_PORT" prepare >"$WORK/prepare.log" 2>&1 ||
	{
		cat "$WORK/prepare.log" >&2
		hs_die "sysbench prepare failed"
	}
# Warm the buffer pool and every path once (not recorded).
for leg in "${LEGS[@]}"; do
	sb oltp_point_select "$(leg_port "$leg")" --threads=4 --time=2 run >/dev/null 2>&1 ||
		hs_log "warmup through $leg failed"
done
check_alive
LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)

# --- interleaved rounds -----------------------------------------------------
for ((round = 1; round <= ROUNDS; round++)); do
	# Rotate the order each round so no leg always runs first or last.
	order=()
	for ((i = 0; i < ${#LEGS[@]}; i++)); do
		order+=("${LEGS[$(((i + round - 1) % ${#LEGS[@]}))]}")
	done
	hs_log "round $round/$ROUNDS: ${order[*]}"
	for leg in "${order[@]}"; do
		run_point_select "$leg" 16 "$round"
		check_alive
	done
	for leg in "${order[@]}"; do
		run_point_select "$leg" 1 "$round"
		check_alive
	done
	for leg in "${order[@]}"; do
		run_latency "$leg" "$round"
		check_alive
	done
done

# --- oltp_read_write: correctness through heatsink, with a direct baseline ---
for leg in direct heatsink; do
	log=$WORK/rw-$leg.log
	hs_log "oltp_read_write 8 threads ${RW_DURATION}s: $leg"
	deadlocks_before=$(innodb_deadlocks)
	if sb oltp_read_write "$(leg_port "$leg")" --threads=8 --time="$RW_DURATION" \
		--report-interval=0 run >"$log" 2>&1; then
		record "$leg" rw_exit 1 0
	else
		tail -n 20 "$log" >&2
		record "$leg" rw_exit 1 1
		leg_failed "$leg" 1 "sysbench oltp_read_write exited non-zero"
	fi
	record "$leg" rw_tps 1 "$(sb_field "$log" tps)"
	record "$leg" rw_qps 1 "$(sb_field "$log" qps)"
	record "$leg" rw_errors 1 "$(sb_field "$log" errors)"
	record "$leg" rw_reconnects 1 "$(sb_field "$log" reconnects)"
	# sysbench retries deadlocks (1213) and counts them as "ignored errors"; the
	# server's own count tells whether that is all they were.
	record "$leg" rw_deadlocks 1 "$(($(innodb_deadlocks) - deadlocks_before))"
	check_alive
done

# --- report -----------------------------------------------------------------
LOADAVG_END=$(cut -d' ' -f1-3 /proc/loadavg)
export LOADAVG_START LOADAVG_END
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | sed -n 1p)
export RAW DURATION ROUNDS LAT_DURATION RW_DURATION TABLES TABLE_SIZE FAILURES CPU_MODEL
export MARIADB_VERSION LAT_SQL
BENCH_DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
NPROC=$(nproc)
KERNEL=$(uname -r)
SYSBENCH_VERSION=$(sysbench --version)
HAPROXY_VERSION=$(haproxy -v | awk 'NR == 1 {print $3}')
GIT_REV=$(git rev-parse --short HEAD 2>/dev/null || echo "no commit")
GIT_DIRTY=
if [[ -n "$(git status --porcelain 2>/dev/null || true)" ]]; then GIT_DIRTY=" (uncommitted changes)"; fi
export BENCH_DATE NPROC KERNEL SYSBENCH_VERSION HAPROXY_VERSION GIT_REV GIT_DIRTY
mkdir -p "$(dirname "$OUT")"
python3 "$SCRIPT_DIR/lib/passthrough_report.py" >"$WORK/report.md"
cp "$WORK/report.md" "$OUT"
cat "$OUT"
hs_log "wrote $OUT"

if ((FAILURES > 0)); then
	hs_log "$FAILURES leg(s) failed"
	exit 1
fi
