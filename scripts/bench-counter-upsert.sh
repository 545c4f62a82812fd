#!/usr/bin/env bash
# What the counter upsert's probes cost: `INSERT … ON DUPLICATE KEY UPDATE` of a
# counter, in one run against one private MariaDB, at 1 and 16 connections (CONNS),
# each leg DURATION seconds (default 8), ROUNDS times interleaved (default 3; medians):
#   direct   the upsert of the hot row, directly (what the rule replaces)
#   base     through a heatsink build given as BASE_BIN (an earlier commit), if set
#   rule     through this build's heatsink with the counter rule
# for three statements: `hot` (one existing key, the key and the counter alone: the row
# probe finds it), `hot_note` (the same with a note: then the key probe runs too) and
# `new` (a fresh key each time: the row probe inserts it). Checks after every leg of a
# hot statement that the hot counter grew by exactly the acknowledged upserts.
# Writes bench/results/counter-upsert.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-"1 16"}
BASE_BIN=${BASE_BIN:-}
OUT=bench/results/counter-upsert.md

cargo build --release --quiet --bin heatsink --example loadgen
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
mariadb_start
db=$SB_DB
mariadb_root "$db" -e "
  CREATE TABLE hits (slug VARCHAR(64) NOT NULL PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0,
    note VARCHAR(20)) ENGINE=InnoDB;
  INSERT INTO hits VALUES ('hot', 0, NULL);"

rules=""
hs_tmpdir_into rules rules
printf '[[counter]]\nname = "hot"\ntable = "hits"\nkey = ["slug"]\ncolumns = ["cnt"]\nslots = 16\nslot_table = "hits_slots"\n' \
  >"$rules/counters.toml"
target/release/heatsink migrate --rules "$rules" \
  --backend-url "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$MARIADB_PORT/$db" --apply >/dev/null

HS_RULES_DIR=$rules heatsink_start "$MARIADB_PORT"
RULE_PORT=$HEATSINK_PORT
legs="direct rule"
if [[ -n $BASE_BIN ]]; then
  HEATSINK_BIN=$BASE_BIN HS_RULES_DIR=$rules heatsink_start "$MARIADB_PORT"
  BASE_PORT=$HEATSINK_PORT
  legs="direct base rule"
fi

url() { echo "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$1/$db"; }
HOT="INSERT INTO hits (slug, cnt) VALUES ('hot', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1"
HOT_NOTE="INSERT INTO hits (slug, cnt, note) VALUES ('hot', 1, 'n') ON DUPLICATE KEY UPDATE cnt = cnt + 1"
NEW="INSERT INTO hits (slug, cnt, note) VALUES ('{randstr:16}', 1, 'n') ON DUPLICATE KEY UPDATE cnt = cnt + 1"
logical() { mariadb_root -N "$db" -e "SELECT cnt + COALESCE((SELECT SUM(cnt) FROM hits_slots WHERE slug = 'hot'), 0) FROM hits WHERE slug = 'hot'"; }

results=$(mktemp)
trap 'rm -f "$results"; hs_cleanup' EXIT
check_failed=0
for ((round = 1; round <= ROUNDS; round++)); do
  for c in $CONNS; do
    for stmt in hot hot_note new; do
      for leg in $legs; do
        case $leg in
          direct) u=$(url "$MARIADB_PORT") ;;
          base) u=$(url "$BASE_PORT") ;;
          rule) u=$(url "$RULE_PORT") ;;
        esac
        case $stmt in
          hot) sql=$HOT ;;
          hot_note) sql=$HOT_NOTE ;;
          new) sql=$NEW ;;
        esac
        before=$(logical)
        json=$(target/release/examples/loadgen --url "$u" -c "$c" -d "$DURATION" --sql "$sql" --json --label "$leg")
        after=$(logical)
        ops=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ops"])' "$json")
        if [[ $stmt == hot* ]] && ((after - before != ops)); then
          hs_log "MISMATCH: $leg c=$c acknowledged $ops, counter grew by $((after - before))"
          check_failed=1
        fi
        printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$c" "$stmt" "$leg" "$json" >>"$results"
        hs_log "round $round c=$c $stmt $leg: $(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%.0f ops/s p95 %.0f us errors %d" % (j["ops_per_sec"], j["p95_us"], j["errors"]))' "$json")"
      done
    done
  done
done

base_version=""
[[ -n $BASE_BIN ]] && base_version=$("$BASE_BIN" --version)
python3 - "$results" "$OUT" "$DURATION" "$ROUNDS" "$MARIADB_VERSION" "$check_failed" "$legs" "$base_version" <<'PY'
import json, statistics, sys, datetime, os, subprocess
path, out, duration, rounds, version, check_failed, legs, base = sys.argv[1:9]
legs = legs.split()
data = {}
for line in open(path):
    rnd, c, stmt, leg, js = line.rstrip("\n").split("\t", 4)
    data.setdefault((int(c), stmt, leg), []).append(json.loads(js))
def med(c, stmt, leg, key):
    return statistics.median(j[key] for j in data[(c, stmt, leg)])
def ratio(c, stmt, a, b):
    # Median of the per-round ratios: legs of one round ran back to back.
    xs = [x["ops_per_sec"] / y["ops_per_sec"] for x, y in zip(data[(c, stmt, a)], data[(c, stmt, b)])]
    return statistics.median(xs)
conns = sorted({c for c, _, _ in data})
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
lines = [
    "# Counter upserts: directly, and through heatsink's counter rule",
    "",
    f"- date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, heatsink {rev}" + (f"; `base`: {base}" if base else ""),
    f"- machine: {os.cpu_count()} cores; MariaDB {version}; client, proxy and server share the machine",
    f"- each leg {duration} s, {rounds} round(s) interleaved; ratios are medians of per-round ratios",
    "- `hot`: `INSERT INTO hits (slug, cnt) VALUES ('hot', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1` (the row exists: the row probe finds it);"
    " `hot_note`: the same with a note (then the key probe runs too);"
    " `new`: with a fresh random key and a note (the row probe inserts it)",
    f"- exact totals (the hot counter grew by the acknowledged upserts): {'**NO**' if check_failed == '1' else 'yes, every leg'}",
    "",
    "## Ratios (ops/s)",
    "",
]
head = "| connections | statement | rule / direct |" + (" rule / base |" if "base" in legs else "")
lines += [head, "|---:|---|---:|" + ("---:|" if "base" in legs else "")]
for c in conns:
    for stmt in ("hot", "hot_note", "new"):
        row = f"| {c} | {stmt} | {ratio(c, stmt, 'rule', 'direct'):.2f} |"
        if "base" in legs:
            row += f" {ratio(c, stmt, 'rule', 'base'):.2f} |"
        lines.append(row)
lines += [
    "",
    "## Raw numbers (medians)",
    "",
    "| connections | statement | leg | ops/s | p50 µs | p95 µs | p99 µs | errors |",
    "|---:|---|---|---:|---:|---:|---:|---:|",
]
for c in conns:
    for stmt in ("hot", "hot_note", "new"):
        for leg in legs:
            lines.append(f"| {c} | {stmt} | {leg} | {med(c, stmt, leg, 'ops_per_sec'):,.0f} | {med(c, stmt, leg, 'p50_us'):,.0f} | {med(c, stmt, leg, 'p95_us'):,.0f} | {med(c, stmt, leg, 'p99_us'):,.0f} | {sum(j['errors'] for j in data[(c, stmt, leg)])} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
exit "$check_failed"
