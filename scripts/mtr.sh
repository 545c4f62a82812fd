#!/usr/bin/env bash
# MariaDB's own regression suite through heatsink: a fixed sample of the main suite
# (SAMPLE below, 180 tests) run once directly against a private mariadbd and once
# through heatsink with no rules in front of it, then compared test by test.
#
#   scripts/mtr.sh                  # writes bench/results/mtr.md
#   TESTS="sp-expr ps_2myisam" scripts/mtr.sh   # another list (report to $OUT)
#
# How (see docs/design.md, "MariaDB's regression suite through heatsink"):
# - mariadb-test-run.pl (package mariadb-test, MTR_DIR) builds its own bootstrap
#   (`--dry-run main.1st` makes install.db: the mysql, mtr and test databases, test time
#   zones). Every server starts from a fresh copy of it with the [mysqld] settings of
#   include/default_mysqld.cnf plus what mtr adds for mysqld.1 (server-id, general and
#   slow log to files), on a free loopback port. As under mtr, its data dir is
#   VARDIR/mysqld.1/data and secure-file-priv is VARDIR, where VARDIR is the vardir of
#   the mtr run that uses it (tests load `../../std_data/…` relative to the data dir).
# - mtr runs in extern mode against 127.0.0.1:PORT (the server, or heatsink in front of
#   a second fresh server), all over TCP: --extern protocol=tcp and a socket that does
#   not exist, so a client that tried the Unix socket fails instead of bypassing the
#   proxy.
# - Extern mode keeps state between tests, and one hung test leaves objects behind, so
#   every test whose outcome differs is run again alone on a fresh server, directly and
#   through heatsink (RECHECK_MAX of them at most). The report gives both.
# - Known differences and their reasons are listed in KNOWN below; a difference not
#   listed there is reported as unexplained.
#
# Bounded: mtr's --testcase-timeout (TEST_TIMEOUT minutes, default 2) stops a hung
# test; a whole mtr run is stopped after RUN_TIMEOUT seconds (default 1200). Every
# process is started by this script and stopped by its pid (mtr and the test clients
# it starts: by the process group of the mtr it started). Only 127.0.0.1 is used.
#
# Knobs: MTR_DIR (default /usr/share/mysql/mysql-test), PROFILE (debug|release, the
# heatsink build to use, default debug; HEATSINK_BIN overrides), OUT, TESTS,
# TEST_TIMEOUT, RUN_TIMEOUT, RECHECK_MAX (default 40), MTR_ARGS (more mariadb-test-run.pl
# options for every run, e.g. --ps-protocol or --cursor-protocol: mysqltest then runs
# the statements as prepared statements, with a cursor), HS_KEEP_TMP=1 (keep logs).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/mariadb.sh
source scripts/lib/mariadb.sh

MTR_DIR=${MTR_DIR:-/usr/share/mysql/mysql-test}
PROFILE=${PROFILE:-debug}
OUT=${OUT:-bench/results/mtr.md}
TEST_TIMEOUT=${TEST_TIMEOUT:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-1200}
RECHECK_MAX=${RECHECK_MAX:-40}
MARIADBD=${MARIADBD:-/usr/sbin/mariadbd}

# The sample: every second test of the main suite (alphabetical) among those that can
# run against a running server reached over TCP: no .opt/.cnf/.combinations file; no
# server restart or kill, replication or binary log, debug build, SSL, Unix socket,
# plugin, or optional feature sourced by name (partitioning, performance schema, query
# cache, sequences, symlinks, profiling, …); source under 30 KB (the long ones would
# dominate the time). Fixed here so that runs compare.
SAMPLE="
1st almost_full alter_table_mdev539_maria alter_table_upgrade_aria ansi auto_increment
auto_increment_ranges_myisam bench_count_distinct binary bool bulk_replace
check_constraint_show column_compression_utf16 comment_table commit
concurrent_innodb_unsafelog consistent_snapshot create-uca create_drop_index
create_drop_server create_drop_view create_utf8 cte_cycle ctype_binary
ctype_collate_context ctype_collate_table ctype_cp1251 ctype_cp866 ctype_create
ctype_errors ctype_filename_innodb ctype_hebrew ctype_latin2 ctype_many ctype_nopad_8bit
ctype_swe7 ctype_ucs2_general_ci_casefold ctype_ucs2_general_mysql500_ci_casefold
ctype_ucs2_turkish_ci_casefold ctype_ucs2_unicode_520_ci_casefold ctype_utf8_uca
ctype_utf8mb3_general_ci_ws ctype_utf8mb3_general_mysql500_ci_ws
ctype_utf8mb3_turkish_ci_casefold ctype_utf8mb4_general_ci_casefold ctype_utf8mb4_heap
ctype_utf8mb4_turkish_ci_casefold ctype_utf8mb4_uca1400_ai_ci_casefold
ctype_utf8mb4_uca_allkeys400 ctype_utf8mb4_unicode_520_ci_casefold
custom_aggregate_functions datetime_456 deprecated_features empty_string_literal
endspace explain_json_innodb fast_prefix_index_fetch_innodb filesort_pack foreign_key
fulltext_cache fulltext_distinct fulltext_multi fulltext_update func_bit func_date_add
func_equal func_int func_regexp func_sapdb func_test func_time_round gis-loaddata
handler_read_last ignored_index_innodb in_subq_cond_pushdown information_schema2
information_schema_linux information_schema_stats innodb_group innodb_icp_debug
innodb_utf8 insert_returning_datatypes invisible_field join_crash join_outer_jcl6
json_normalize key_primary keywords last_value limit lock_kill locking_clause
long_unique_bugs_no_sp_protocol long_unique_using_hash mdev-25830 mdev-35765 mdev13607
mdev316 memory_used metadata mix2_myisam_ucs2 my_print_defaults
myisam_explain_non_select_all myisam_icp_debug mysqld--help-aria mysqltest_256
name_const_replacement non_blocking_api opt_trace_default order_by_optimizer
order_fill_sortbuf overflow partition_mrr_aria partition_mrr_myisam precedence_bugs
progress_976225 ps_2myisam ps_5merge ps_max_subselect-5113 ps_missed_cmds_bin_prot
range_mrr_icp reopen_temp_table replace_returning replace_returning_err round
rowid_filter_myisam_debug schema select_found select_safe set_operation_oracle
show_row_order-9226 signal_demo2 signal_sqlmode single_delete_update
sp-anchor-row-type-cursor sp-anchor-type sp-expr sp-for-loop sp-memory-leak sp-ucs2
sql_mode_pad_char_to_full_length stack stat_tables_missing statistics_close
strict_autoinc_1myisam strict_autoinc_3heap subselect-crash_15755 subselect3_jcl6
subselect_mat_analyze_json subselect_no_mat subselect_no_scache subselect_nulls_innodb
subselect_sj_aria sum_distinct synchronization system_mysql_db_refs table_options
temporal_scale_4283 trigger-33083 type_bit_innodb type_char type_datetime_round
type_hex_hybrid type_interval type_nchar type_row type_time_hires type_timestamp_hires
type_uint union_innodb unsafe_binlog_innodb view_alias win_avg win_big-mdev-11697
win_empty_over win_i_s win_lead_lag win_nth_value win_percent_cume win_std
"

# Differences explained so far: test -> reason (the report quotes it).
declare -A KNOWN=(
)

# ---------------------------------------------------------------------------

hs_install_traps
hs_tmpdir_into WORK mtr
[[ -f "$MTR_DIR/mariadb-test-run.pl" ]] || hs_die "mariadb-test-run.pl not found in $MTR_DIR (apt install mariadb-test)"
if [[ -z "${HEATSINK_BIN:-}" ]]; then
	if [[ $PROFILE == release ]]; then
		cargo build --release --quiet --bin heatsink
	else
		cargo build --quiet --bin heatsink
	fi
	HEATSINK_BIN=$PWD/target/$PROFILE/heatsink
fi
export HEATSINK_BIN
read -r -a TEST_LIST <<<"$(echo "${TESTS:-$SAMPLE}" | tr '\n' ' ')"
hs_log "mtr: ${#TEST_LIST[@]} tests, work dir $WORK"

# mtr reads TZ, LC_ALL and friends itself; the servers get mtr's defaults too.
unset TZ MYSQL_HOST MYSQL_TCP_PORT MYSQL_UNIX_PORT MYSQL_PWD
export LC_ALL=C

# mtr_group_run LOG TIMEOUT ARGS... -> runs mariadb-test-run.pl in its own session (so
# that the test clients it starts can be stopped with it by its process group) and
# waits at most TIMEOUT seconds. Returns mtr's exit status (124 when stopped).
mtr_group_run() {
	local log=$1 timeout=$2 pid rc=0 waited=0
	shift 2
	(cd "$MTR_DIR" && exec setsid perl ./mariadb-test-run.pl "$@") >"$log" 2>&1 &
	pid=$!
	hs_register_pid "$pid"
	while kill -0 "$pid" 2>/dev/null; do
		if ((waited >= timeout * 10)); then
			hs_log "mtr (pid $pid) still running after ${timeout}s: stopping its process group"
			kill -TERM -- "-$pid" 2>/dev/null || true
			sleep 5
			kill -KILL -- "-$pid" 2>/dev/null || true
			wait "$pid" 2>/dev/null || true
			hs_forget_pid "$pid"
			return 124
		fi
		sleep 0.1
		waited=$((waited + 1))
	done
	wait "$pid" || rc=$?
	hs_forget_pid "$pid"
	# Anything of its group still alive (a client a test left behind) goes with it.
	kill -KILL -- "-$pid" 2>/dev/null || true
	return "$rc"
}

# 1. mtr's own bootstrap.
hs_log "mtr: bootstrap (mariadb-test-run.pl --dry-run main.1st)"
mtr_group_run "$WORK/bootstrap.log" 600 --vardir="$WORK/boot" --dry-run main.1st ||
	{
		tail -30 "$WORK/bootstrap.log" >&2
		hs_die "mtr bootstrap failed"
	}
[[ -d "$WORK/boot/install.db/mysql" ]] || hs_die "no install.db after the bootstrap"

# The [mysqld] settings mtr gives its servers.
mysqld_settings() { # mysqld_settings VARDIR
	python3 - "$MTR_DIR/include/default_mysqld.cnf" "$1" "$MTR_DIR" <<'EOF'
import sys
path, vardir, testdir = sys.argv[1:]
section = None
for line in open(path):
    s = line.strip()
    if s.startswith("[") and s.endswith("]"):
        section = s[1:-1]
        continue
    if not s or s.startswith("#") or section not in ("mysqld", "server"):
        continue
    s = s.replace("@ENV.MYSQLTEST_VARDIR", vardir).replace("@ENV.MYSQL_TEST_DIR", testdir)
    print(s)
EOF
}

SERVER_SEQ=0
# server_start VARDIR -> a fresh mariadbd from install.db. Sets SRV_PORT SRV_PID SRV_DIR.
server_start() {
	local vardir=$1 i
	SERVER_SEQ=$((SERVER_SEQ + 1))
	SRV_DIR=$WORK/server$SERVER_SEQ
	# mtr in extern mode keeps an existing vardir and logs into its log/ at once.
	mkdir -p "$SRV_DIR/tmp" "$vardir/log" "$vardir/mysqld.1"
	cp -r "$WORK/boot/install.db" "$vardir/mysqld.1/data"
	chmod -R u+w "$vardir/mysqld.1/data"
	SRV_PORT=$(hs_free_port)
	{
		echo "[mysqld]"
		mysqld_settings "$vardir"
		echo "datadir=$vardir/mysqld.1/data"
		echo "tmpdir=$SRV_DIR/tmp"
		echo "socket=$SRV_DIR/mysqld.sock"
		echo "pid-file=$SRV_DIR/mysqld.pid"
		echo "log-error=$SRV_DIR/mysqld.err"
		echo "general-log=1"
		echo "general-log-file=$SRV_DIR/mysqld.log"
		echo "slow-query-log=1"
		echo "slow-query-log-file=$SRV_DIR/mysqld-slow.log"
		echo "log-output=file"
		echo "server-id=1"
		echo "port=$SRV_PORT"
		echo "bind-address=127.0.0.1"
		if [[ $(id -u) == 0 ]]; then echo "user=root"; fi
	} >"$SRV_DIR/my.cnf"
	setsid "$MARIADBD" --defaults-file="$SRV_DIR/my.cnf" >"$SRV_DIR/stdout.log" 2>&1 &
	SRV_PID=$!
	hs_register_pid "$SRV_PID"
	for ((i = 0; i < 600; i++)); do
		kill -0 "$SRV_PID" 2>/dev/null || {
			tail -20 "$SRV_DIR/mysqld.err" >&2
			hs_die "mariadbd exited during startup"
		}
		if mariadb --no-defaults --protocol=tcp -h127.0.0.1 -P"$SRV_PORT" -uroot -e 'SELECT 1' >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.1
	done
	hs_die "mariadbd did not come up within 60 s"
}

server_stop() {
	hs_stop_pid "$SRV_PID" 60
	SRV_PID=
}

# run_mtr NAME PORT VARDIR TESTS... -> runs the tests against 127.0.0.1:PORT; the
# outcome per test ("main.x pass|fail|skipped|...") goes to $WORK/NAME.status.
run_mtr() {
	local name=$1 port=$2 vardir=$3 rc=0
	shift 3
	local cases=()
	local t
	for t in "$@"; do cases+=("main.$t"); done
	mtr_group_run "$WORK/$name.log" "$RUN_TIMEOUT" \
		--extern host=127.0.0.1 --extern port="$port" --extern user=root \
		--extern protocol=tcp --extern socket=/nonexistent \
		--vardir="$vardir" --force --retry=0 --max-test-fail=0 --parallel=1 --noreorder \
		--testcase-timeout="$TEST_TIMEOUT" --suite-timeout=$(((RUN_TIMEOUT + 59) / 60)) \
		${MTR_ARGS:-} "${cases[@]}" || rc=$?
	# Result lines: "main.name   [ pass ]   12" (possibly with a combination in quotes).
	sed -nE "s/^(main\.[^ ]+)( '[^']*')? +\[ ([a-z-]+) \].*/\1 \3/p" "$WORK/$name.log" >"$WORK/$name.status"
	# A test that was stopped by the run's time limit has no result line.
	for t in "${cases[@]}"; do
		grep -q "^$t " "$WORK/$name.status" || echo "$t none" >>"$WORK/$name.status"
	done
	hs_log "mtr $name: exit $rc, $(grep -c ' pass$' "$WORK/$name.status") pass, $(grep -c ' fail$' "$WORK/$name.status") fail, $(grep -c ' skipped$' "$WORK/$name.status") skipped"
}

# 2. The sample directly, then through heatsink, each on a fresh server.
started=$(date +%s)
server_start "$WORK/var-direct"
MARIADB_VERSION=$(mariadb --no-defaults --protocol=tcp -h127.0.0.1 -P"$SRV_PORT" -uroot -N -e 'SELECT VERSION()')
hs_log "mariadb $MARIADB_VERSION on 127.0.0.1:$SRV_PORT: direct run"
run_mtr direct "$SRV_PORT" "$WORK/var-direct" "${TEST_LIST[@]}"
server_stop
direct_secs=$(($(date +%s) - started))

started=$(date +%s)
server_start "$WORK/var-proxy"
heatsink_start "$SRV_PORT"
hs_log "through heatsink 127.0.0.1:$HEATSINK_PORT"
run_mtr proxy "$HEATSINK_PORT" "$WORK/var-proxy" "${TEST_LIST[@]}"
cp "$HEATSINK_LOG" "$WORK/heatsink-proxy.log"
heatsink_stop
server_stop
proxy_secs=$(($(date +%s) - started))

# 3. Differences, each re-run alone on fresh servers.
status_of() { # status_of NAME TEST
	awk -v t="main.$2" '$1 == t { print $2; exit }' "$WORK/$1.status"
}
DIFFS=()
for t in "${TEST_LIST[@]}"; do
	d=$(status_of direct "$t")
	p=$(status_of proxy "$t")
	if [[ "$d" != "$p" ]]; then DIFFS+=("$t"); fi
done
hs_log "differences: ${#DIFFS[@]} (${DIFFS[*]:-none})"

declare -A RE_DIRECT=() RE_PROXY=()
n=0
for t in "${DIFFS[@]}"; do
	n=$((n + 1))
	if ((n > RECHECK_MAX)); then break; fi
	server_start "$WORK/var-re-direct-$t"
	run_mtr "re-direct-$t" "$SRV_PORT" "$WORK/var-re-direct-$t" "$t"
	server_stop
	RE_DIRECT[$t]=$(status_of "re-direct-$t" "$t")
	server_start "$WORK/var-re-proxy-$t"
	heatsink_start "$SRV_PORT"
	run_mtr "re-proxy-$t" "$HEATSINK_PORT" "$WORK/var-re-proxy-$t" "$t"
	heatsink_stop
	server_stop
	RE_PROXY[$t]=$(status_of "re-proxy-$t" "$t")
	# The first lines of the failure, for the report.
	sed -n '/^main\.'"$t"' .*\[ fail \]/,/^ - saving/p' "$WORK/re-proxy-$t.log" | head -40 >"$WORK/why-$t.txt"
done

# 4. The report.
first_error() { # first_error NAME TEST -> the first line that says why TEST failed in run NAME
	sed -n "/^main\.$2 .*\[ fail \]/,/^ - saving/p" "$WORK/$1.log" |
		awk '/^(mysqltest: )?At line|^mysqltest: Result/ { print; exit }
			/^[-+][^-+]/ { line = line (line == "" ? "" : " / ") $0; if (++n == 2) { print line; exit } }
			END { if (n == 1) print line }' | sed -E 's/\|/\\|/g' | cut -c1-200
}
count() { grep -c " $2\$" "$WORK/$1.status" || true; }
ran() { grep -vcE ' (skipped|disabled|none)$' "$WORK/$1.status" || true; }
mkdir -p "$(dirname "$OUT")"
{
	echo "# MariaDB's regression suite through heatsink"
	echo
	echo "\`scripts/mtr.sh\`, $(date -u +%Y-%m-%d), MariaDB $MARIADB_VERSION, heatsink $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo '+changes') ($PROFILE build), no rules."
	echo "A fixed sample of ${#TEST_LIST[@]} main-suite tests, run by \`mariadb-test-run.pl --extern\` over TCP"
	echo "(\`protocol=tcp\`, \`socket=/nonexistent\`${MTR_ARGS:+, \`$MTR_ARGS\`}), each side on a fresh server made from mtr's bootstrap"
	echo "with the settings of \`include/default_mysqld.cnf\`; every difference re-run alone on fresh servers."
	echo
	echo "| | directly | through heatsink |"
	echo "|---|---:|---:|"
	echo "| tests in the sample | ${#TEST_LIST[@]} | ${#TEST_LIST[@]} |"
	echo "| run (not skipped) | $(ran direct) | $(ran proxy) |"
	echo "| **pass** | **$(count direct pass)** | **$(count proxy pass)** |"
	echo "| fail | $(count direct fail) | $(count proxy fail) |"
	echo "| skipped by mtr | $(count direct skipped) | $(count proxy skipped) |"
	echo "| no result (run stopped) | $(count direct none) | $(count proxy none) |"
	echo "| wall time | ${direct_secs} s | ${proxy_secs} s |"
	echo
	if ((${#DIFFS[@]} == 0)); then
		echo "No test has a different outcome through heatsink."
	else
		echo "## Differences"
		echo
		echo "| test | directly | through heatsink | alone, fresh server: directly | alone, fresh server: through heatsink | reason |"
		echo "|---|---|---|---|---|---|"
		for t in "${DIFFS[@]}"; do
			reason=${KNOWN[$t]:-}
			if [[ -z $reason && -n ${RE_DIRECT[$t]:-} && ${RE_DIRECT[$t]} == "${RE_PROXY[$t]:-}" ]]; then
				reason="same outcome alone on fresh servers: state left behind by an earlier failure of the run ($(first_error proxy "$t"))"
			fi
			echo "| main.$t | $(status_of direct "$t") | $(status_of proxy "$t") | ${RE_DIRECT[$t]:-not re-run} | ${RE_PROXY[$t]:-not re-run} | ${reason:-unexplained} |"
		done
	fi
	echo
	echo "Tests that fail both ways (extern mode against this server; the first line of the direct failure):"
	echo
	both=0
	for t in "${TEST_LIST[@]}"; do
		if [[ $(status_of direct "$t") == fail && $(status_of proxy "$t") == fail ]]; then
			echo "- main.$t: \`$(first_error direct "$t" | tr -d '`')\`"
			both=$((both + 1))
		fi
	done
	((both > 0)) || echo "None."
	echo
	echo "Tests skipped by mtr on either side (their reason is mtr's):"
	echo
	grep -h ' skipped$' "$WORK/direct.status" "$WORK/proxy.status" | sort -u | awk '{print $1}' |
		while read -r t; do
			echo "- $t: $(sed -nE "s/^$t +\[ skipped \] +(.*)/\1/p" "$WORK/direct.log" | head -1)"
		done
	echo
	echo "The sample (every second main-suite test, alphabetically, of those that can run against a"
	echo "running server over TCP; see the script): ${TEST_LIST[*]}"
} >"$OUT"
for t in "${DIFFS[@]}"; do
	if [[ -s "$WORK/why-$t.txt" ]]; then
		hs_log "main.$t through heatsink (alone):"
		cat "$WORK/why-$t.txt" >&2
	fi
done
hs_log "wrote $OUT"
