# shellcheck shell=bash
# Shared helpers for benchmark and test scripts: a private MariaDB, heatsink and
# haproxy, each on a free loopback port, each stopped by pid.
#
# Usage (from a script):
#   source "$(dirname "$0")/lib/mariadb.sh"
#   hs_install_traps                 # stop everything started below on EXIT/INT/TERM
#   mariadb_start                    # sets MARIADB_PORT MARIADB_PID MARIADB_DIR MARIADB_SOCKET
#   heatsink_start "$MARIADB_PORT"   # sets HEATSINK_PORT HEATSINK_PID HEATSINK_DIR
#   haproxy_start "$MARIADB_PORT"    # sets HAPROXY_PORT HAPROXY_PID HAPROXY_DIR
#   haproxy_unix_start "$MARIADB_SOCKET"  # sets HAPROXY_UNIX_SOCK HAPROXY_UNIX_PID
#
# Everything started is recorded in HS_PIDS / HS_DIRS; hs_cleanup stops the pids
# (TERM, then KILL after a timeout) in reverse order and removes the temp dirs.
# Nothing is ever stopped by name.
#
# Environment knobs:
#   MARIADBD            mariadbd binary (default /usr/sbin/mariadbd)
#   MARIADB_INSTALL_DB  mariadb-install-db binary (default: from PATH)
#   MARIADB_EXTRA_ARGS  extra mariadbd arguments (word-split)
#   HEATSINK_BIN        heatsink binary (default: <repo>/target/release/heatsink)
#   HEATSINK_LOG_LEVEL  --log-level for heatsink (default warn)
#   HS_KEEP_TMP=1       keep temp dirs (logs) after exit

HS_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HS_REPO_DIR="$(cd "$HS_LIB_DIR/../.." && pwd)"

# The credentials every script uses.
SB_DB=sbtest
SB_USER=sb
SB_PASSWORD=sb-pw

HS_PIDS=()
HS_DIRS=()

# Log lines go to the script's original stderr (saved by hs_install_traps), also
# when the caller has redirected stderr, e.g. while a trap runs inside `cmd 2>log`.
hs_log() {
	if [[ -n "${HS_LOG_FD:-}" ]]; then
		printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&"$HS_LOG_FD"
	else
		printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2
	fi
}
hs_die() {
	hs_log "error: $*"
	exit 1
}

# hs_tmpdir NAME -> prints a new temp dir, removed by hs_cleanup.
# Must not be called in a subshell ($(...)) or the dir is not registered; use
# hs_tmpdir_into VAR NAME instead.
hs_tmpdir_into() {
	local __var=$1 __name=${2:-tmp} __dir
	__dir=$(mktemp -d "${TMPDIR:-/tmp}/heatsink-$__name.XXXXXX") || hs_die "mktemp failed"
	HS_DIRS+=("$__dir")
	printf -v "$__var" '%s' "$__dir"
}

# hs_free_port -> prints a loopback TCP port that was free a moment ago.
hs_free_port() {
	python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

# hs_port_open PORT -> success when something accepts on 127.0.0.1:PORT.
hs_port_open() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Services are started as `setsid CMD ... &`: in their own session, so a Ctrl-C in
# the terminal reaches only the script and its foreground client, and the script's
# traps then stop the services in order. setsid does not fork here (a background
# job of a non-interactive shell is not a process group leader), so $! is the
# service's own pid.

# hs_register_pid PID -> stopped by hs_cleanup.
hs_register_pid() { HS_PIDS+=("$1"); }

hs_forget_pid() {
	local keep=() p
	for p in "${HS_PIDS[@]}"; do [[ "$p" == "$1" ]] || keep+=("$p"); done
	HS_PIDS=("${keep[@]}")
}

# hs_run CMD ARGS... -> runs a client (sysbench, loadgen) to completion and returns
# its status. It runs in the background while the script waits for it, so a Ctrl-C
# or TERM runs the script's traps at once (a foreground child that catches SIGINT
# itself, as sysbench does, would make bash carry on with the next command), and
# hs_cleanup stops the client by pid. Redirect its output to a file, not $(...).
hs_run() {
	"$@" &
	local pid=$! rc=0
	hs_register_pid "$pid"
	wait "$pid" || rc=$?
	hs_forget_pid "$pid"
	return "$rc"
}

# hs_cpu_us PID [user] -> the process's CPU time so far in µs: user + system, or with
# "user" the user time alone (fields 14 and 15 of /proc/PID/stat; the command name
# before them may hold spaces).
hs_cpu_us() {
	sed 's/^.*) //' "/proc/$1/stat" |
		awk -v t="$(getconf CLK_TCK)" -v only="${2:-}" '{ printf "%d\n", ($12 + (only == "user" ? 0 : $13)) * 1000000 / t }'
}

# hs_stop_pid PID [TIMEOUT_SECS] -> TERM, wait, then KILL. Only the given pid.
hs_stop_pid() {
	local pid=$1 timeout=${2:-20} i
	[[ -n "$pid" ]] || return 0
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for ((i = 0; i < timeout * 10; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			hs_log "pid $pid did not stop after ${timeout}s, sending KILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	wait "$pid" 2>/dev/null || true
	hs_forget_pid "$pid"
}

hs_cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	local i
	for ((i = ${#HS_PIDS[@]} - 1; i >= 0; i--)); do
		hs_stop_pid "${HS_PIDS[$i]}"
	done
	if [[ "${HS_KEEP_TMP:-0}" == 1 ]]; then
		((${#HS_DIRS[@]} == 0)) || hs_log "kept temp dirs: ${HS_DIRS[*]}"
	else
		local d
		for d in "${HS_DIRS[@]}"; do
			[[ -n "$d" && -d "$d" ]] && rm -rf -- "$d"
		done
	fi
	HS_DIRS=()
	return "$rc"
}

# hs_install_traps -> everything registered is stopped on exit, Ctrl-C or TERM.
hs_install_traps() {
	exec {HS_LOG_FD}>&2
	trap hs_cleanup EXIT
	trap 'hs_log "interrupted"; exit 130' INT
	trap 'hs_log "terminated"; exit 143' TERM
}

# ---------------------------------------------------------------------------
# MariaDB
# ---------------------------------------------------------------------------

# mariadb_start -> starts a private mariadbd in a temp data dir and creates the
# database `sbtest` and the user 'sb'@'%' IDENTIFIED BY 'sb-pw'.
# Sets MARIADB_PORT MARIADB_PID MARIADB_DIR MARIADB_SOCKET.
mariadb_start() {
	local mariadbd=${MARIADBD:-/usr/sbin/mariadbd}
	local install_db=${MARIADB_INSTALL_DB:-mariadb-install-db}
	local dir user_args=()
	hs_tmpdir_into dir mariadb
	MARIADB_DIR=$dir
	MARIADB_SOCKET=$dir/mysqld.sock
	MARIADB_PORT=$(hs_free_port)
	mkdir -p "$dir/data" "$dir/tmp"
	if [[ $(id -u) == 0 ]]; then user_args=(--user=root); fi

	hs_log "mariadb: initialising data dir in $dir"
	"$install_db" --no-defaults --datadir="$dir/data" "${user_args[@]}" \
		--auth-root-authentication-method=normal --skip-test-db \
		>"$dir/install.log" 2>&1 || {
		cat "$dir/install.log" >&2
		hs_die "mariadb-install-db failed"
	}

	# shellcheck disable=SC2086
	setsid "$mariadbd" --no-defaults "${user_args[@]}" \
		--datadir="$dir/data" --tmpdir="$dir/tmp" \
		--socket="$MARIADB_SOCKET" --pid-file="$dir/mysqld.pid" \
		--log-error="$dir/error.log" \
		--port="$MARIADB_PORT" --bind-address=127.0.0.1 \
		--skip-log-bin --skip-name-resolve \
		--innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=2 \
		--max-connections=1000 \
		${MARIADB_EXTRA_ARGS:-} \
		>"$dir/stdout.log" 2>&1 &
	MARIADB_PID=$!
	hs_register_pid "$MARIADB_PID"

	local i
	for ((i = 0; i < 600; i++)); do
		if ! kill -0 "$MARIADB_PID" 2>/dev/null; then
			cat "$dir/error.log" >&2 2>/dev/null
			hs_die "mariadbd exited during startup"
		fi
		if mariadb_root -e 'SELECT 1' >/dev/null 2>&1; then break; fi
		sleep 0.1
	done
	mariadb_root -e 'SELECT 1' >/dev/null 2>&1 || hs_die "mariadbd did not come up within 60s"

	mariadb_root -e "CREATE DATABASE IF NOT EXISTS \`$SB_DB\`;
		CREATE USER IF NOT EXISTS '$SB_USER'@'%' IDENTIFIED BY '$SB_PASSWORD';
		GRANT ALL PRIVILEGES ON *.* TO '$SB_USER'@'%';
		FLUSH PRIVILEGES;" || hs_die "creating database/user failed"
	MARIADB_VERSION=$(mariadb_root -N -e 'SELECT VERSION()')
	hs_log "mariadb: $MARIADB_VERSION on 127.0.0.1:$MARIADB_PORT (pid $MARIADB_PID)"
}

# mariadb_root ARGS... -> the mariadb CLI as root over the private socket.
mariadb_root() {
	mariadb --no-defaults --protocol=socket --socket="$MARIADB_SOCKET" -uroot "$@"
}

# mariadb_sb PORT ARGS... -> the mariadb CLI as sb over TCP to PORT (e.g. a proxy).
mariadb_sb() {
	local port=$1
	shift
	mariadb --no-defaults --protocol=tcp -h127.0.0.1 -P"$port" -u"$SB_USER" -p"$SB_PASSWORD" "$SB_DB" "$@"
}

mariadb_stop() {
	hs_stop_pid "$MARIADB_PID" 60
	MARIADB_PID=
}

# ---------------------------------------------------------------------------
# heatsink
# ---------------------------------------------------------------------------

# heatsink_start BACKEND [EXTRA_ARGS...] -> heatsink serve with an empty rules
# dir (pure passthrough), or the rules in $HS_RULES_DIR when set. BACKEND is a port
# on 127.0.0.1, or `host:port[,host:port…]` (the nodes of a cluster).
# Sets HEATSINK_PORT HEATSINK_PID HEATSINK_DIR HEATSINK_LOG.
heatsink_start() {
	local backend_port=$1 backend=$1
	shift
	[[ $backend == *:* ]] || backend="127.0.0.1:$backend"
	local bin=${HEATSINK_BIN:-$HS_REPO_DIR/target/release/heatsink}
	[[ -x "$bin" ]] || hs_die "heatsink binary not found at $bin (cargo build --release)"
	local dir
	hs_tmpdir_into dir heatsink
	HEATSINK_DIR=$dir
	mkdir -p "$dir/rules"
	HEATSINK_PORT=$(hs_free_port)
	HEATSINK_LOG=$dir/heatsink.log
	setsid "$bin" serve --listen "127.0.0.1:$HEATSINK_PORT" --backend "$backend" \
		--rules "${HS_RULES_DIR:-$dir/rules}" --log-level "${HEATSINK_LOG_LEVEL:-warn}" "$@" \
		>"$HEATSINK_LOG" 2>&1 &
	HEATSINK_PID=$!
	hs_register_pid "$HEATSINK_PID"
	local i
	for ((i = 0; i < 300; i++)); do
		if ! kill -0 "$HEATSINK_PID" 2>/dev/null; then
			cat "$HEATSINK_LOG" >&2
			hs_die "heatsink exited during startup"
		fi
		if grep -q 'listening on' "$HEATSINK_LOG" 2>/dev/null || hs_port_open "$HEATSINK_PORT"; then
			hs_log "heatsink: 127.0.0.1:$HEATSINK_PORT -> $backend_port (pid $HEATSINK_PID)"
			return 0
		fi
		sleep 0.1
	done
	cat "$HEATSINK_LOG" >&2
	hs_die "heatsink did not listen within 30s"
}

heatsink_stop() {
	hs_stop_pid "$HEATSINK_PID" 30
	HEATSINK_PID=
}

# ---------------------------------------------------------------------------
# haproxy (TCP mode, the L4 baseline)
# ---------------------------------------------------------------------------

# haproxy_config FILE BIND SERVER: a TCP-mode haproxy that relays BIND to SERVER
# (haproxy address syntax: `127.0.0.1:PORT` or `unix@PATH`).
haproxy_config() {
	cat >"$1" <<EOF
global
    maxconn 4096

defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h

frontend mysql_in
    bind $2
    default_backend mysql_out

backend mysql_out
    server db $3
EOF
}

# haproxy_start BACKEND_PORT -> sets HAPROXY_PORT HAPROXY_PID HAPROXY_DIR.
haproxy_start() {
	local backend_port=$1
	local dir
	hs_tmpdir_into dir haproxy
	HAPROXY_DIR=$dir
	HAPROXY_PORT=$(hs_free_port)
	haproxy_config "$dir/haproxy.cfg" "127.0.0.1:$HAPROXY_PORT" "127.0.0.1:$backend_port"
	setsid haproxy -f "$dir/haproxy.cfg" -db >"$dir/haproxy.log" 2>&1 &
	HAPROXY_PID=$!
	hs_register_pid "$HAPROXY_PID"
	local i
	for ((i = 0; i < 100; i++)); do
		if ! kill -0 "$HAPROXY_PID" 2>/dev/null; then
			cat "$dir/haproxy.log" >&2
			hs_die "haproxy exited during startup"
		fi
		if hs_port_open "$HAPROXY_PORT"; then
			hs_log "haproxy: 127.0.0.1:$HAPROXY_PORT -> $backend_port (pid $HAPROXY_PID)"
			return 0
		fi
		sleep 0.1
	done
	hs_die "haproxy did not listen within 10s"
}

# haproxy_unix_start BACKEND_SOCKET -> haproxy on a Unix socket in front of the
# server's socket. Sets HAPROXY_UNIX_SOCK HAPROXY_UNIX_PID.
haproxy_unix_start() {
	local dir
	hs_tmpdir_into dir haproxy-unix
	HAPROXY_UNIX_SOCK=$dir/haproxy.sock
	haproxy_config "$dir/haproxy.cfg" "unix@$HAPROXY_UNIX_SOCK" "unix@$1"
	setsid haproxy -f "$dir/haproxy.cfg" -db >"$dir/haproxy.log" 2>&1 &
	HAPROXY_UNIX_PID=$!
	hs_register_pid "$HAPROXY_UNIX_PID"
	local i
	for ((i = 0; i < 100; i++)); do [[ -S $HAPROXY_UNIX_SOCK ]] && break; sleep 0.1; done
	[[ -S $HAPROXY_UNIX_SOCK ]] || hs_die "haproxy did not listen on $HAPROXY_UNIX_SOCK"
	hs_log "haproxy: $HAPROXY_UNIX_SOCK -> $1 (pid $HAPROXY_UNIX_PID)"
}

haproxy_stop() {
	hs_stop_pid "$HAPROXY_PID" 10
	HAPROXY_PID=
}
