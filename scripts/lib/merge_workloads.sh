# shellcheck shell=bash
# The three group-commit workloads the merge benchmarks share (bench-merge-state,
# bench-cpu): a hot counter `hits`, a ring log `log`, a rollup log `plays` with two
# rollups, as a DBA writes the rules (group commit on by default).
#
#   merge_workloads_schema DB      creates the tables in DB (as root)
#   merge_workloads_rules FILE     writes the rule file

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
