#!/usr/bin/env bash
# Hot counter on a 3-node Galera cluster, in one run (each leg DURATION seconds,
# default 10; PER_NODE connections per node, default 8):
#   direct_multi   UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home', PER_NODE
#                  connections straight to each node (multi-primary)
#   hs_unmerged    the same through one heatsink per node, counter rule, coalesce = false
#   hs_rule        the same through one heatsink per node, the rule as a DBA writes it
#                  (group commit on)
#   direct_single  3 × PER_NODE connections straight to node 1 (single-primary)
#   hs_single      3 × PER_NODE connections through one heatsink with
#                  --backend n1,n2,n3 --backend-policy first, the rule
#   plain_direct   3 × PER_NODE connections to one plain MariaDB server
#   plain_hs       the same through heatsink with the rule
# ROUNDS times (default 3), the order of the legs rotated each round; the report
# gives each leg's median rate and the median of its per-round ratios to
# direct_multi. After every leg the counter (base + slots) must have grown by exactly
# the acknowledged increments. Writes bench/results/cluster.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
PER_NODE=${PER_NODE:-8}
ROUNDS=${ROUNDS:-3}
OUT=bench/results/cluster.md
TARGET=${CARGO_TARGET_DIR:-target}

cargo build --release --quiet --bin heatsink --example loadgen
export HEATSINK_BIN=$TARGET/release/heatsink
LOADGEN=$TARGET/release/examples/loadgen
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
# shellcheck source=lib/galera.sh
source scripts/lib/galera.sh
hs_install_traps
mariadb_start
galera_start 3
db=$SB_DB
SCHEMA="CREATE TABLE hits (slug VARCHAR(64) NOT NULL PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB;
  INSERT INTO hits VALUES ('home', 0);"
mariadb_root "$db" -e "$SCHEMA"
galera_root 0 "$db" -e "$SCHEMA"

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
for port in "$MARIADB_PORT" "${GALERA_PORTS[0]}"; do
  "$HEATSINK_BIN" migrate --rules "$rules_on" \
    --backend-url "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$port/$db" --apply >/dev/null
done

NODES=""
for p in "${GALERA_PORTS[@]}"; do NODES+="${NODES:+,}127.0.0.1:$p"; done
UN_PORTS=(); RULE_PORTS=()
for p in "${GALERA_PORTS[@]}"; do
  HS_RULES_DIR=$rules_un heatsink_start "$p"
  UN_PORTS+=("$HEATSINK_PORT")
  HS_RULES_DIR=$rules_on heatsink_start "$p"
  RULE_PORTS+=("$HEATSINK_PORT")
done
HS_RULES_DIR=$rules_on heatsink_start "$NODES" --backend-policy first \
  --health-user hs_health --health-password health-pw
SINGLE_PORT=$HEATSINK_PORT
HS_RULES_DIR=$rules_on heatsink_start "$MARIADB_PORT"
PLAIN_HS_PORT=$HEATSINK_PORT

url() { echo "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$1/$db"; }
UPDATE="UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'"
LOGICAL="SELECT cnt + COALESCE((SELECT SUM(cnt) FROM hits_slots WHERE slug = 'home'), 0) FROM hits WHERE slug = 'home'"
logical_cluster() { galera_root 0 -N "$db" -e "SET SESSION wsrep_sync_wait = 15; $LOGICAL"; }
logical_plain() { mariadb_root -N "$db" -e "$LOGICAL"; }

work=""
hs_tmpdir_into work bench-cluster
results=$work/results.tsv
: >"$results"
check_failed=0

# leg NAME KIND CONNS PORT... -> runs loadgen against every PORT at once (CONNS
# connections each) and records the summed rate, errors and the exactness check.
leg() {
  local name=$1 kind=$2 conns=$3
  shift 3
  local before after ops=0 errors=0 i=0 pids=() p
  if [[ $kind == plain ]]; then before=$(logical_plain); else before=$(logical_cluster); fi
  for p in "$@"; do
    "$LOADGEN" --url "$(url "$p")" -c "$conns" -d "$DURATION" --sql "$UPDATE" --json \
      --label "$name" >"$work/$name.$i.json" 2>"$work/$name.$i.err" &
    pids+=("$!")
    hs_register_pid "$!"
    i=$((i + 1))
  done
  for p in "${pids[@]}"; do wait "$p"; hs_forget_pid "$p"; done
  if [[ $kind == plain ]]; then after=$(logical_plain); else after=$(logical_cluster); fi
  for ((i = 0; i < $#; i++)); do
    read -r o e < <(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["ops"], j["errors"])' "$work/$name.$i.json")
    ops=$((ops + o)); errors=$((errors + e))
  done
  local exact=yes
  if ((after - before != ops)); then
    exact="no (grew by $((after - before)))"
    [[ $name == direct_* ]] || check_failed=1
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$name" "$((conns * $#))" "$ops" "$errors" "$exact" >>"$results"
  hs_log "$name: $ops increments in ${DURATION}s ($((ops / DURATION))/s), $errors errors, exact: $exact"
}

LEGS=(direct_multi hs_unmerged hs_rule direct_single hs_single plain_direct plain_hs)
run_leg() {
  case $1 in
    direct_multi) leg direct_multi cluster "$PER_NODE" "${GALERA_PORTS[@]}" ;;
    hs_unmerged) leg hs_unmerged cluster "$PER_NODE" "${UN_PORTS[@]}" ;;
    hs_rule) leg hs_rule cluster "$PER_NODE" "${RULE_PORTS[@]}" ;;
    direct_single) leg direct_single cluster "$((3 * PER_NODE))" "${GALERA_PORTS[0]}" ;;
    hs_single) leg hs_single cluster "$((3 * PER_NODE))" "$SINGLE_PORT" ;;
    plain_direct) leg plain_direct plain "$((3 * PER_NODE))" "$MARIADB_PORT" ;;
    plain_hs) leg plain_hs plain "$((3 * PER_NODE))" "$PLAIN_HS_PORT" ;;
  esac
}
for ((round = 1; round <= ROUNDS; round++)); do
  for ((k = 0; k < ${#LEGS[@]}; k++)); do
    run_leg "${LEGS[$(((k + round - 1) % ${#LEGS[@]}))]}"
  done
done

mkdir -p bench/results
python3 - "$results" "$DURATION" "$PER_NODE" "$MARIADB_VERSION" "$ROUNDS" >"$OUT" <<'PY'
import statistics, sys
path, duration, per_node, version, rounds = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
order = []
by = {}
for rnd, name, conns, ops, errors, exact in rows:
    if name not in by:
        order.append(name)
        by[name] = {"conns": conns, "rates": {}, "errors": 0, "exact": []}
    by[name]["rates"][rnd] = int(ops) / duration
    by[name]["errors"] += int(errors)
    by[name]["exact"].append(exact)
base_rounds = by.get("direct_multi", {}).get("rates", {})
base = statistics.median(base_rounds.values()) if base_rounds else 1.0
what = {
    "direct_multi": "multi-primary, straight to the nodes",
    "hs_unmerged": "multi-primary, one heatsink per node, `coalesce = false`",
    "hs_rule": "multi-primary, one heatsink per node, the rule as a DBA writes it (group commit)",
    "direct_single": "single-primary, straight to node 1",
    "hs_single": "single-primary, one heatsink, `--backend n1,n2,n3 --backend-policy first`",
    "plain_direct": "one plain server, straight",
    "plain_hs": "one plain server through heatsink, the rule",
}
print("# Hot counter on a 3-node Galera cluster\n")
print(f"`scripts/bench-cluster.sh`: `UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'`, {duration:g} s per leg, {rounds} rounds (leg order rotated), "
      f"{per_node} connections per node on the multi-primary legs (the same total on the others), "
      f"MariaDB {version} with galera-4, every node, proxy and client on this 2-core machine, "
      "all legs in one run. Ratios are against the direct multi-primary median of the same run. "
      "`exact`: the counter (base + slots) grew by the acknowledged increments.\n")
print("| leg | setup | connections | increments/s (median) | min–max | errors (all rounds) | × direct multi-primary | median of per-round ratios | exact |")
print("|---|---|---|---|---|---|---|---|---|")
for name in sorted(order, key=lambda n: list(what).index(n) if n in what else 99):
    d = by[name]
    rates = d["rates"]
    med = statistics.median(rates.values())
    per_round = [rates[r] / base_rounds[r] for r in rates if base_rounds.get(r)]
    ratio_rounds = statistics.median(per_round) if per_round else float("nan")
    exact = "yes" if all(e == "yes" for e in d["exact"]) else "; ".join(e for e in d["exact"] if e != "yes")
    print(f"| {name} | {what.get(name, '')} | {d['conns']} | {med:,.0f} | {min(rates.values()):,.0f}–{max(rates.values()):,.0f} | "
          f"{d['errors']:,} | {med / base:.2f} | {ratio_rounds:.2f} | {exact} |")
PY
hs_log "wrote $OUT"
cat "$OUT"
exit "$check_failed"
