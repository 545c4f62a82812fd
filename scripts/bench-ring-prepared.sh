#!/usr/bin/env bash
# Ring inserts through heatsink as text statements and as prepared statements, with
# and without group commit (coalesce = true), at CONNS connections (default 64), in
# one run against one private MariaDB: ROUNDS (default 2) interleaved rounds of
# DURATION seconds (default 6) per leg; the median per leg is reported, and ratios
# against the unmerged ring of the same protocol. Writes bench/results/ring-prepared.md.
#   INSERT INTO log (uid, visitor_uid, last_update) VALUES ({rand:1:1000}, {rand}, NOW(6))
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-6}
ROUNDS=${ROUNDS:-2}
CONNS=${CONNS:-64}
OUT=${OUT:-bench/results/ring-prepared.md}
LOADGEN=${LOADGEN:-target/release/examples/loadgen}

[[ ${SKIP_BUILD:-0} == 1 ]] || cargo build --release --quiet --bin heatsink --example loadgen
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
mariadb_start

mariadb_root -e "CREATE DATABASE ring; USE ring; CREATE TABLE log (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  uid INT NOT NULL,
  visitor_uid INT NOT NULL,
  last_update DATETIME(6) NOT NULL,
  KEY by_uid (uid, id)
) ENGINE=InnoDB"
plain="" co=""
hs_tmpdir_into plain rules-plain
hs_tmpdir_into co rules-co
printf '[[ring]]\nname = "visits"\ntable = "log"\nkey = ["uid"]\nsize = 5\nring_table = "log_ring"\nseq_table = "log_seq"\n' >"$plain/ring.toml"
{
  cat "$plain/ring.toml"
  echo 'coalesce = true'
} >"$co/ring.toml"
url() { echo "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$1/ring"; }
target/release/heatsink migrate --rules "$plain" --backend-url "$(url "$MARIADB_PORT")" --apply >/dev/null
HS_RULES_DIR=$plain heatsink_start "$MARIADB_PORT"
PLAIN_PORT=$HEATSINK_PORT
HS_RULES_DIR=$co heatsink_start "$MARIADB_PORT"
CO_PORT=$HEATSINK_PORT

sql='INSERT INTO log (uid, visitor_uid, last_update) VALUES ({rand:1:1000}, {rand:1:1000000}, NOW(6))'
results=$(mktemp)
trap 'rm -f "$results"; hs_cleanup' EXIT
legs=(ring ring_co ring_prep ring_co_prep)
for ((round = 1; round <= ROUNDS; round++)); do
  for ((i = 0; i < ${#legs[@]}; i++)); do
    leg=${legs[$(((i + round - 1) % ${#legs[@]}))]}
    port=$PLAIN_PORT mode=()
    [[ $leg == ring_co* ]] && port=$CO_PORT
    [[ $leg == *_prep ]] && mode=(--prepared)
    json=$(hs_run "$LOADGEN" --url "$(url "$port")" -c "$CONNS" -d "$DURATION" --sql "$sql" "${mode[@]}" --json --label "$leg")
    printf '%s\t%s\n' "$leg" "$json" >>"$results"
    hs_log "round $round $leg: $(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%.0f inserts/s p95 %.0f us errors %d" % (j["ops_per_sec"], j["p95_us"], j["errors"]))' "$json")"
  done
done

python3 - "$results" "$OUT" "$DURATION" "$ROUNDS" "$CONNS" "$MARIADB_VERSION" <<'PY'
import json, statistics, sys, datetime, os, subprocess
path, out, duration, rounds, conns, version = sys.argv[1:7]
data = {}
for line in open(path):
    leg, js = line.rstrip("\n").split("\t", 1)
    data.setdefault(leg, []).append(json.loads(js))
med = lambda leg, k: statistics.median(j[k] for j in data[leg])
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
load = open("/proc/loadavg").read().split()[:3]
lines = [
    "# Ring inserts, text and prepared, with and without group commit",
    "",
    f"- date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, heatsink {rev}; load average at the end {' '.join(load)}",
    f"- machine: {os.cpu_count()} cores; MariaDB {version}; client, proxy and server share the machine",
    f"- {conns} connections, each leg {duration} s, {rounds} round(s) interleaved, medians",
    "- `INSERT INTO log (uid, visitor_uid, last_update) VALUES ({rand:1:1000}, {rand}, NOW(6))` through heatsink"
    " with a `[[ring]]` rule (size 5, key uid); `_prep` legs send it as a prepared statement (binary protocol)",
    "- ring_co legs: the same rule with `coalesce = true` (a second heatsink on the same tables)",
    "",
    "| leg | inserts/s | p95 µs | errors | vs unmerged, same protocol |",
    "|---|---:|---:|---:|---:|",
]
for leg, base in (("ring", "ring"), ("ring_co", "ring"), ("ring_prep", "ring_prep"), ("ring_co_prep", "ring_prep")):
    r = med(leg, "ops_per_sec") / med(base, "ops_per_sec")
    errs = sum(j["errors"] for j in data[leg])
    lines.append(f"| {leg} | {med(leg, 'ops_per_sec'):,.0f} | {med(leg, 'p95_us'):,.0f} | {errs} | {r:.2f} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
