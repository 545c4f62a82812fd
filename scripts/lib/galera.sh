# shellcheck shell=bash
# A private Galera cluster on loopback ports for benchmark scripts (after
# scripts/lib/mariadb.sh, whose pid and temp dir bookkeeping it uses).
#
#   galera_start 3     # sets GALERA_PORTS (client ports), GALERA_PIDS, GALERA_DIR
#   galera_root I ARGS # the mariadb CLI as root on node I (0-based)
#
# Node 1 bootstraps the cluster (--wsrep-new-cluster) and gets the database `sbtest`
# and the users 'sb'@'%' and 'hs_health'@'%' (password health-pw, no privileges: for
# heatsink's health checker); the others join it by state transfer (rsync). State
# transfer by rsync fails when mariadbd runs as root, so the nodes run as `mysql`
# (mariadbd --user=mysql drops privileges itself, so $! stays its pid) in
# directories that user owns. Every node is stopped by pid by hs_cleanup.

GALERA_PORTS=()
GALERA_PIDS=()

galera_root() {
	local i=$1
	shift
	mariadb --no-defaults --protocol=socket --socket="$GALERA_DIR/node$((i + 1))/sock" -uroot "$@"
}

# galera_status I VAR -> the global status variable VAR of node I (empty if down).
galera_status() {
	galera_root "$1" -N -e "SHOW GLOBAL STATUS LIKE '$2'" 2>/dev/null | cut -f2
}

# galera_wait_synced I SIZE -> waits (120 s at most) until node I is Synced in a
# cluster of SIZE nodes.
galera_wait_synced() {
	local i=$1 size=$2 n
	for ((n = 0; n < 1200; n++)); do
		if [[ $(galera_status "$i" wsrep_local_state_comment) == Synced &&
			$(galera_status "$i" wsrep_cluster_size) == "$size" ]]; then
			return 0
		fi
		kill -0 "${GALERA_PIDS[$i]}" 2>/dev/null || {
			tail -30 "$GALERA_DIR/node$((i + 1))/error.log" >&2
			hs_die "galera node $((i + 1)) exited"
		}
		sleep 0.1
	done
	tail -30 "$GALERA_DIR/node$((i + 1))/error.log" >&2
	hs_die "galera node $((i + 1)) not Synced in a cluster of $size after 120 s"
}

# galera_start N -> starts an N-node cluster.
galera_start() {
	local n=$1 i dir gports=() gcomm=""
	local mariadbd=${MARIADBD:-/usr/sbin/mariadbd}
	id mysql >/dev/null 2>&1 || hs_die "the Galera nodes run as the user mysql, which does not exist"
	[[ -f /usr/lib/galera/libgalera_smm.so ]] || hs_die "galera-4 is not installed"
	hs_tmpdir_into dir galera
	GALERA_DIR=$dir
	chmod 755 "$dir"
	# Private temp dirs: temporary table files of other servers in /tmp can collide.
	mkdir -p "$dir/tmp"
	chown mysql:mysql "$dir/tmp"
	mariadb-install-db --no-defaults --user=mysql --datadir="$dir/template" --tmpdir="$dir/tmp" \
		--auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1 || {
		cat "$dir/install.log" >&2
		hs_die "mariadb-install-db failed"
	}
	for ((i = 0; i < n; i++)); do
		GALERA_PORTS+=("$(hs_free_port)")
		gports+=("$(hs_free_port)")
		gcomm+="${gcomm:+,}127.0.0.1:${gports[$i]}"
		mkdir -p "$dir/node$((i + 1))/tmp"
		cp -a "$dir/template" "$dir/node$((i + 1))/data"
	done
	chown -R mysql:mysql "$dir"
	for ((i = 0; i < n; i++)); do
		local nd=$dir/node$((i + 1)) address="gcomm://$gcomm" extra=()
		if ((i == 0)); then
			address="gcomm://"
			extra=(--wsrep-new-cluster)
		fi
		# shellcheck disable=SC2086
		setsid "$mariadbd" --no-defaults --user=mysql \
			--datadir="$nd/data" --tmpdir="$nd/tmp" --socket="$nd/sock" --pid-file="$nd/mariadbd.pid" \
			--log-error="$nd/error.log" --port="${GALERA_PORTS[$i]}" --bind-address=127.0.0.1 \
			--skip-log-bin --skip-name-resolve --binlog-format=ROW --innodb-autoinc-lock-mode=2 \
			--innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=2 --max-connections=1000 \
			--wsrep-on=ON --wsrep-provider=/usr/lib/galera/libgalera_smm.so \
			--wsrep-cluster-name=heatsink_bench --wsrep-node-name="node$((i + 1))" \
			--wsrep-node-address="127.0.0.1:${gports[$i]}" \
			--wsrep-provider-options="gmcast.listen_addr=tcp://127.0.0.1:${gports[$i]};ist.recv_addr=127.0.0.1:$(hs_free_port);gcache.size=128M" \
			--wsrep-sst-receive-address="127.0.0.1:$(hs_free_port)" --wsrep-sst-method=rsync \
			--wsrep-cluster-address="$address" "${extra[@]}" ${MARIADB_EXTRA_ARGS:-} \
			>"$nd/stdout.log" 2>&1 &
		GALERA_PIDS+=("$!")
		hs_register_pid "$!"
		if ((i == 0)); then
			galera_wait_synced 0 1
			galera_root 0 -e "CREATE DATABASE IF NOT EXISTS \`$SB_DB\`;
				CREATE USER IF NOT EXISTS '$SB_USER'@'%' IDENTIFIED BY '$SB_PASSWORD';
				GRANT ALL PRIVILEGES ON *.* TO '$SB_USER'@'%';
				CREATE USER IF NOT EXISTS 'hs_health'@'%' IDENTIFIED BY 'health-pw';" ||
				hs_die "creating database/users failed"
		fi
	done
	for ((i = 0; i < n; i++)); do galera_wait_synced "$i" "$n"; done
	hs_log "galera: $n nodes Synced on ports ${GALERA_PORTS[*]} (pids ${GALERA_PIDS[*]})"
}
