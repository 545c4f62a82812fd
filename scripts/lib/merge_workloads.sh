# shellcheck shell=bash
# The three group-commit workloads the merge benchmarks share (bench-merge-state,
# bench-cpu): a hot counter `hits`, a ring log `log`, a rollup log `plays` with two
# rollups, as a DBA writes the rules (group commit on by default).
#
#   merge_workloads_schema DB      creates the tables in DB (as root)
#   merge_workloads_rules FILE     writes the rule file
#   merge_workloads_migrate KIND DIR BIN  switches one kind's rules on

merge_workloads_schema() {
	mariadb_root "$1" -e "
  CREATE TABLE hits (slug VARCHAR(64) NOT NULL PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB;
  INSERT INTO hits VALUES ('hot', 0);
  CREATE TABLE log (
    id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    uid INT NOT NULL,
    visitor_uid INT NOT NULL,
    last_update DATETIME(6) NOT NULL,
    KEY by_uid (uid, id)
  ) ENGINE=InnoDB;
  CREATE TABLE plays (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    created_at DATETIME DEFAULT NULL,
    track_id INT DEFAULT NULL,
    user_id INT DEFAULT NULL,
    referer TEXT,
    country VARCHAR(255) DEFAULT NULL,
    api_consumer_key VARCHAR(255) DEFAULT NULL,
    KEY (track_id),
    KEY (user_id),
    KEY (created_at)
  ) ENGINE=InnoDB;"
}

# merge_workloads_migrate KIND DIR HEATSINK_BIN -> the rules of one kind (ring,
# rollup, counter) with their tables qualified by $SB_DB, written to DIR/rules and
# switched on in $SB_DB with `heatsink migrate --apply` (its output in DIR/migrate.log)
merge_workloads_migrate() {
	local kind=$1 dir=$2 bin=$3
	merge_workloads_rules "$dir/all.toml"
	mkdir -p "$dir/rules"
	awk -v want="[[$kind]]" '/^\[\[/ { keep = ($0 == want) } keep' "$dir/all.toml" |
		sed -E "s/^table = \"/table = \"$SB_DB./" >"$dir/rules/rules.toml"
	"$bin" migrate --rules "$dir/rules" \
		--backend-url "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$MARIADB_PORT/$SB_DB" --apply \
		>"$dir/migrate.log" 2>&1 || {
		cat "$dir/migrate.log" >&2
		hs_die "heatsink migrate failed"
	}
}

merge_workloads_rules() {
	cat >"$1" <<'EOF'
[[counter]]
name = "hot"
table = "hits"
key = ["slug"]
columns = ["cnt"]
slots = 16
slot_table = "hits_slots"

[[ring]]
name = "visits"
table = "log"
key = ["uid"]
size = 5
ring_table = "log_ring"
seq_table = "log_seq"
order_by = "id"

[[rollup]]
name = "plays_by_country_hour"
table = "plays"
rollup_table = "plays_by_country_hour"
time = "created_at"
bucket = "hour"
dimensions = ["track_id", "country"]
slots = 8

[[rollup]]
name = "plays_by_country_day"
table = "plays"
rollup_table = "plays_by_country_day"
time = "created_at"
bucket = "day"
dimensions = ["track_id", "country"]
slots = 8
EOF
}

# merge_workloads_lua DIR -> one sysbench Lua script per write statement, one
# statement per event: DIR/counter.lua, DIR/ring.lua, DIR/rollup.lua, and
# DIR/ring_purge.lua (the ring's appends, and every 10th event the per-key purge
# down to the newest 5 rows that an application without heatsink runs).
merge_workloads_lua() {
	local dir=$1
	local ring_sql="INSERT INTO log (uid, visitor_uid, last_update) VALUES (%d, %d, NOW(6))"
	local ring_args="(sysbench.rand.uniform(1, 2) == 1) and sysbench.rand.uniform(1, 10) or sysbench.rand.uniform(11, 1000), sysbench.rand.uniform(1, 1000000)"
	_merge_workloads_lua "$dir/counter.lua" "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'hot'" "nil" false
	_merge_workloads_lua "$dir/ring.lua" "$ring_sql" "$ring_args" false
	_merge_workloads_lua "$dir/ring_purge.lua" "$ring_sql" "$ring_args" true
	_merge_workloads_lua "$dir/rollup.lua" "INSERT INTO plays (created_at, track_id, user_id, country) VALUES (NOW(), %d, %d, '%s')" \
		"(sysbench.rand.uniform(1, 2) == 1) and 123 or sysbench.rand.uniform(1000, 100999), sysbench.rand.uniform(1, 1000000), ({'US','GB','DE','FR','BR','JP','IN','MX','ES','SE'})[sysbench.rand.uniform(1, 10)]" false
}

# _merge_workloads_lua FILE STATEMENT-FORMAT ARGS-LUA PURGE
_merge_workloads_lua() {
	cat >"$1" <<LUA
local n = 0
function thread_init()
  drv = sysbench.sql.driver()
  con = drv:connect()
end
function event()
  n = n + 1
  if $4 and n % 10 == 0 then
    local k = (sysbench.rand.uniform(1, 2) == 1) and sysbench.rand.uniform(1, 10) or sysbench.rand.uniform(11, 1000)
    con:query(string.format("DELETE l FROM log l JOIN (SELECT uid, id FROM log WHERE uid = %d ORDER BY id DESC LIMIT 1 OFFSET 4) t ON l.uid = t.uid AND l.id < t.id", k))
  else
    con:query(string.format("$2", $3))
  end
end
function thread_done()
  con:disconnect()
end
LUA
}
