#!/usr/bin/env bash
# Hot-counter benchmark, in one run against one private MariaDB, at 1, 16 and 64
# connections (CONNS to change), each leg DURATION seconds (default 10), ROUNDS times
# interleaved (default 1; the median is reported):
#   single   UPDATE hits SET cnt = cnt + 1 WHERE slug = 'hot'       directly
#   slots    the hand-written slot upsert (random slot of 16)       directly
#   slots_hs the hand-written slot upsert through heatsink (passthrough: the hop's cost)
#   unmerged the same UPDATE through heatsink with the counter rule, coalesce = false
#   rule     the same UPDATE through heatsink with the rule as a DBA writes it (no
#            coalesce key: group commit on by default)
# and checks after every proxied leg that the counter grew by exactly the number of
# acknowledged increments. Writes bench/results/counter.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-1}
CONNS=${CONNS:-"1 16 64"}
OUT=bench/results/counter.md

cargo build --release --quiet --bin heatsink --example loadgen
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
mariadb_start
db=$SB_DB
mariadb_root "$db" -e "
  CREATE TABLE hits (slug VARCHAR(64) NOT NULL PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB;
  INSERT INTO hits VALUES ('hot', 0);"

rules_on=""; rules_un=""
hs_tmpdir_into rules_on rules-on
hs_tmpdir_into rules_un rules-unmerged
rule='[[counter]]
name = "hot"
table = "hits"
key = ["slug"]
columns = ["cnt"]
slots = 16
slot_table = "hits_slots"'
printf '%s\n' "$rule" >"$rules_on/counters.toml"
printf '%s\ncoalesce = false\n' "$rule" >"$rules_un/counters.toml"
target/release/heatsink migrate --rules "$rules_on" \
  --backend-url "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$MARIADB_PORT/$db" --apply >/dev/null

HS_RULES_DIR=$rules_un heatsink_start "$MARIADB_PORT"
UN_PORT=$HEATSINK_PORT
CO_METRICS_PORT=$(hs_free_port)
HS_RULES_DIR=$rules_on heatsink_start "$MARIADB_PORT" --metrics "127.0.0.1:$CO_METRICS_PORT"
RULE_PORT=$HEATSINK_PORT

url() { echo "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$1/$db"; }
UPDATE="UPDATE hits SET cnt = cnt + 1 WHERE slug = 'hot'"
SLOTS="INSERT INTO hits_slots (slug, slot, cnt) VALUES ('hot', {rand:0:15}, 1) ON DUPLICATE KEY UPDATE cnt = cnt + VALUES(cnt)"
logical() { mariadb_root -N "$db" -e "SELECT cnt + COALESCE((SELECT SUM(cnt) FROM hits_slots WHERE slug = 'hot'), 0) FROM hits WHERE slug = 'hot'"; }

results=$(mktemp)
trap 'rm -f "$results"; hs_cleanup' EXIT
check_failed=0
for ((round = 1; round <= ROUNDS; round++)); do
  for c in $CONNS; do
    for leg in single slots slots_hs unmerged rule; do
      case $leg in
        single) u=$(url "$MARIADB_PORT"); sql=$UPDATE ;;
        slots) u=$(url "$MARIADB_PORT"); sql=$SLOTS ;;
        slots_hs) u=$(url "$RULE_PORT"); sql=$SLOTS ;;
        unmerged) u=$(url "$UN_PORT"); sql=$UPDATE ;;
        rule) u=$(url "$RULE_PORT"); sql=$UPDATE ;;
      esac
      before=$(logical)
      json=$(target/release/examples/loadgen --url "$u" -c "$c" -d "$DURATION" --sql "$sql" --json --label "$leg")
      after=$(logical)
      ops=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ops"])' "$json")
      # Warm-up is off, so every acknowledged statement is counted in ops.
      if [[ $leg == rule || $leg == unmerged ]] && ((after - before != ops)); then
        hs_log "MISMATCH: $leg c=$c acknowledged $ops, counter grew by $((after - before))"
        check_failed=1
      fi
      printf '%s\t%s\t%s\t%s\n' "$round" "$c" "$leg" "$json" >>"$results"
      hs_log "round $round c=$c $leg: $(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%.0f ops/s p95 %.0f us errors %d" % (j["ops_per_sec"], j["p95_us"], j["errors"]))' "$json")"
    done
  done
done
coalesced=$(curl -s "http://127.0.0.1:$CO_METRICS_PORT/metrics" 2>/dev/null | grep -E '^heatsink_coalesced' || true)

python3 - "$results" "$OUT" "$DURATION" "$ROUNDS" "$MARIADB_VERSION" "$check_failed" <<'PY'
import json, statistics, sys, datetime, os, subprocess
path, out, duration, rounds, version, check_failed = sys.argv[1:7]
rows = [l.rstrip("\n").split("\t", 3) for l in open(path)]
data = {}
for rnd, c, leg, js in rows:
    data.setdefault((int(c), leg), []).append(json.loads(js))
def med(c, leg, key):
    return statistics.median(j[key] for j in data[(c, leg)])
conns = sorted({c for c, _ in data})
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
lines = [
    "# Hot counter: single row vs slot rows vs heatsink's counter rule",
    "",
    f"- date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, heatsink {rev}",
    f"- machine: {os.cpu_count()} cores; MariaDB {version}; client, proxy and server share the machine",
    f"- each leg {duration} s, {rounds} round(s) interleaved, medians; `UPDATE hits SET cnt = cnt + 1 WHERE slug = 'hot'` (one hot key), 16 slots",
    f"- exact totals (counter grew by the number of acknowledged increments through the proxy): {'**NO**' if check_failed == '1' else 'yes, every proxied leg'}",
    "",
    "## Ratios",
    "",
    "| connections | rule (default) / single row | rule / unmerged | rule / hand-written slots | unmerged / single row | unmerged / hand-written slots through heatsink |",
    "|---:|---:|---:|---:|---:|---:|",
]
for c in conns:
    s, h, hh, u, r = (med(c, l, "ops_per_sec") for l in ("single", "slots", "slots_hs", "unmerged", "rule"))
    lines.append(f"| {c} | {r/s:.2f} | {r/u:.2f} | {r/h:.2f} | {u/s:.2f} | {u/hh:.2f} |")
lines += [
    "",
    "`rule` is the rule file as a DBA writes it (no `coalesce` key: group commit on by default); `unmerged` says `coalesce = false`.",
    "Targets: at 64 connections rule ≥ 4 × single row; at 1 connection rule ≈ unmerged (the default costs nothing without contention).",
    "",
    "## Raw numbers",
    "",
    "| connections | leg | ops/s | p50 µs | p95 µs | p99 µs | errors |",
    "|---:|---|---:|---:|---:|---:|---:|",
]
for c in conns:
    for leg in ("single", "slots", "slots_hs", "unmerged", "rule"):
        lines.append(f"| {c} | {leg} | {med(c, leg, 'ops_per_sec'):,.0f} | {med(c, leg, 'p50_us'):,.0f} | {med(c, leg, 'p95_us'):,.0f} | {med(c, leg, 'p99_us'):,.0f} | {sum(j['errors'] for j in data[(c, leg)])} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
[[ -n $coalesced ]] && printf '\nrule proxy counters:\n%s\n' "$coalesced" | tee -a "$OUT"
exit "$check_failed"
