#!/usr/bin/env bash
# What keeping two rollups current costs the server per log row, in each shape a
# merged write could take. The log `plays` and its two rollups (hour and day per
# track and country, 8 slots) are the ones bench-sysbench.sh uses, created by
# `heatsink migrate`; half of the plays are on one track, the rest on 100,000 others.
# CONNS connections (the merge lanes) each send BATCHES merged writes of ROWS rows,
# all at once, straight to the server over its socket; the figure is the server's
# CPU time (/proc/PID/stat) over the leg divided by the log rows. Shapes:
#
#   bare       the log without triggers: the floor
#   triggers   the rollups' triggers as `migrate` writes them (one upsert per row
#              and rollup): what a merged insert costs today
#   upserts    the same triggers gated off by a user variable, and per batch one
#              multi-row upsert per rollup with the batch's groups counted up
#              (what aggregating each batch's deltas in the proxy would send), in
#              one transaction
#   reselect   gated triggers, and per batch one INSERT … SELECT … GROUP BY per
#              rollup over the batch's id range (the server computing the groups)
#   deltas     triggers appending to a narrow pending-delta table per rollup (no
#              upsert on the hot rows), then, as a separate leg, `fold`: one
#              connection folding the deltas into the rollups 500 at a time, each
#              chunk folded and deleted in one transaction, as a fold job would
#
#   scripts/bench-rollup-upkeep.sh             # about 3 minutes
#
# Environment: ROUNDS (3), CONNS (4), BATCHES (2000), ROWS_LIST ("4 8"),
# SKIP_BUILD=1, HEATSINK_BIN, OUT (bench/results/rollup-upkeep.md).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/mariadb.sh
source "$SCRIPT_DIR/lib/mariadb.sh"
# shellcheck source=lib/merge_workloads.sh
source "$SCRIPT_DIR/lib/merge_workloads.sh"
hs_install_traps

ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-4}
BATCHES=${BATCHES:-2000}
ROWS_LIST=${ROWS_LIST:-"4 8"}
OUT=${OUT:-$HS_REPO_DIR/bench/results/rollup-upkeep.md}
HEATSINK_BIN=${HEATSINK_BIN:-$HS_REPO_DIR/target/release/heatsink}
if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$HS_REPO_DIR" && cargo build --release --quiet)
fi

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M')
mariadb_start
hs_tmpdir_into WORK upkeep
merge_workloads_schema "$SB_DB"
merge_workloads_migrate rollup "$WORK" "$HEATSINK_BIN"

ROLLUPS=(plays_by_country_hour plays_by_country_day)
declare -A BODY
for r in "${ROLLUPS[@]}"; do
  BODY[$r]=$(mariadb_root -N -r "$SB_DB" -e "SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS
    WHERE TRIGGER_SCHEMA = '$SB_DB' AND TRIGGER_NAME = '${r}_hs_ins'")
  [[ -n ${BODY[$r]} ]] || hs_die "no insert trigger for $r"
  mariadb_root "$SB_DB" -e "CREATE TABLE ${r}_pending (
    id BIGINT AUTO_INCREMENT PRIMARY KEY, track_id INT NOT NULL, country VARCHAR(255) NOT NULL,
    hs_nulls INT UNSIGNED NOT NULL, hs_bucket DATETIME NOT NULL, hs_slot SMALLINT UNSIGNED NOT NULL,
    hs_rows BIGINT NOT NULL) ENGINE=InnoDB"
done

# set_triggers MODE: none | migrated | gated | deltas
set_triggers() {
  local r body
  for r in "${ROLLUPS[@]}"; do
    mariadb_root "$SB_DB" -e "DROP TRIGGER IF EXISTS ${r}_hs_ins"
    body=${BODY[$r]}
    case $1 in
      none) continue ;;
      gated) body="BEGIN IF @hs_upkeep_batch IS NULL THEN $body; END IF; END" ;;
      deltas) body=${body/INSERT INTO \`$SB_DB\`.\`$r\`/INSERT INTO \`$SB_DB\`.\`${r}_pending\`}
        body=${body%% ON DUPLICATE KEY UPDATE*} ;;
    esac
    printf 'delimiter //\nCREATE TRIGGER %s_hs_ins AFTER INSERT ON plays FOR EACH ROW %s//\n' "$r" "$body" |
      mariadb_root "$SB_DB"
  done
}

# The merged writes, one file per connection and shape (seeded: every round sends
# the same rows). GROUPS: the average number of groups per batch and rollup.
gen() {
  python3 - "$WORK" "$CONNS" "$BATCHES" "$1" <<'PY'
import random, sys, time
work, conns, batches, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
countries = ['US', 'GB', 'DE', 'FR', 'BR', 'JP', 'IN', 'MX', 'ES', 'SE']
fmts = {'plays_by_country_hour': '%Y-%m-%d %H:00:00', 'plays_by_country_day': '%Y-%m-%d 00:00:00'}
cols = '(track_id, country, hs_nulls, hs_bucket, hs_slot, hs_rows)'
odku = 'ON DUPLICATE KEY UPDATE hs_rows = hs_rows + VALUES(hs_rows)'
groups = 0
for c in range(conns):
    rnd = random.Random(c)
    out = {s: open(f'{work}/{s}-{rows}-{c}.sql', 'w') for s in ('plain', 'upserts', 'reselect')}
    for s in ('upserts', 'reselect'):
        out[s].write('delimiter $$\n')
    for _ in range(batches):
        batch = [(123 if rnd.random() < 0.5 else rnd.randint(1000, 100999), rnd.randint(1, 1000000),
                  rnd.choice(countries)) for _ in range(rows)]
        ins = 'INSERT INTO plays (created_at, track_id, user_id, country) VALUES ' + ','.join(
            f"(NOW(), {t}, {u}, '{k}')" for t, u, k in batch)
        out['plain'].write(ins + ';\n')
        ups, sel = [], []
        for r, fmt in fmts.items():
            counted = {}
            for t, _, k in batch:
                counted[(t, k)] = counted.get((t, k), 0) + 1
            groups += len(counted)
            bucket = time.strftime(fmt, time.gmtime())
            ups.append(f'INSERT INTO {r} {cols} VALUES ' + ','.join(
                f"({t}, '{k}', 0, '{bucket}', {c}, {n})" for (t, k), n in sorted(counted.items())) + ' ' + odku)
            sel.append(f'INSERT INTO {r} {cols} SELECT IFNULL(track_id, 0), IFNULL(country, \'\'), '
                       f'((track_id IS NULL) << 0) | ((country IS NULL) << 1) | ((created_at IS NULL) << 31), '
                       f"CAST(IFNULL(DATE_FORMAT(created_at, '{fmt}'), '1000-01-01 00:00:00') AS DATETIME), "
                       f'CONNECTION_ID() % 8, COUNT(*) FROM plays '
                       f'WHERE id BETWEEN LAST_INSERT_ID() AND LAST_INSERT_ID() + {rows - 1} GROUP BY 1, 2, 3, 4 {odku}')
        for s, extra in (('upserts', ups), ('reselect', sel)):
            out[s].write('BEGIN; SET @hs_upkeep_batch = 1; ' + '; '.join([ins] + extra)
                         + '; SET @hs_upkeep_batch = NULL; COMMIT$$\n')
print(f'{groups / (conns * batches * 2):.2f}')
PY
}

RAW=$WORK/raw.tsv
: >"$RAW"
# leg ROUND ROWS NAME FILE-SHAPE TRIGGERS -> server µs per log row into $RAW
leg() {
  local round=$1 rows=$2 name=$3 shape=$4 s0 s1 c pids=()
  set_triggers "$5"
  s0=$(hs_cpu_us "$MARIADB_PID")
  for ((c = 0; c < CONNS; c++)); do
    mariadb_root "$SB_DB" <"$WORK/$shape-$rows-$c.sql" &
    pids+=($!)
  done
  for c in "${pids[@]}"; do wait "$c" || hs_die "leg $name failed"; done
  s1=$(hs_cpu_us "$MARIADB_PID")
  printf '%s\t%s\t%s\t%s\n' "$round" "$rows" "$name" "$(((s1 - s0) / (CONNS * BATCHES * rows)))" >>"$RAW"
}
# fold ROUND ROWS -> the pending deltas folded into the rollups, µs per log row
fold() {
  local round=$1 rows=$2 r s0 s1 left
  s0=$(hs_cpu_us "$MARIADB_PID")
  for r in "${ROLLUPS[@]}"; do
    left=1
    while ((left > 0)); do
      left=$(mariadb_root -N "$SB_DB" -e "BEGIN;
        SELECT MAX(id) INTO @upto FROM (SELECT id FROM ${r}_pending ORDER BY id LIMIT 500) t;
        INSERT INTO $r (track_id, country, hs_nulls, hs_bucket, hs_slot, hs_rows)
          SELECT track_id, country, hs_nulls, hs_bucket, hs_slot, SUM(hs_rows) FROM ${r}_pending
          WHERE id <= @upto GROUP BY track_id, country, hs_nulls, hs_bucket, hs_slot
          ON DUPLICATE KEY UPDATE hs_rows = hs_rows + VALUES(hs_rows);
        DELETE FROM ${r}_pending WHERE id <= @upto;
        COMMIT;
        SELECT EXISTS (SELECT 1 FROM ${r}_pending)")
    done
  done
  s1=$(hs_cpu_us "$MARIADB_PID")
  printf '%s\t%s\t%s\t%s\n' "$round" "$rows" "fold" "$(((s1 - s0) / (CONNS * BATCHES * rows)))" >>"$RAW"
}

declare -A GROUPS_OF
for rows in $ROWS_LIST; do GROUPS_OF[$rows]=$(gen "$rows"); done
for ((round = 1; round <= ROUNDS; round++)); do
  for rows in $ROWS_LIST; do
    leg "$round" "$rows" bare plain none
    leg "$round" "$rows" triggers plain migrated
    leg "$round" "$rows" upserts upserts gated
    leg "$round" "$rows" reselect reselect gated
    leg "$round" "$rows" deltas plain deltas
    fold "$round" "$rows"
    hs_log "round $round, $rows rows per batch: $(awk -F'\t' -v r="$round" -v n="$rows" '$1 == r && $2 == n { printf "%s %s µs  ", $3, $4 }' "$RAW")"
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

groups=""
for rows in $ROWS_LIST; do groups+="$rows rows: ${GROUPS_OF[$rows]}; "; done
B_DATE="$started–$(date -u +%H:%M) UTC" B_COMMIT=$(git -C "$HS_REPO_DIR" rev-parse --short HEAD) \
  B_VERSION=$MARIADB_VERSION B_LOAD="$load_start / $load_end" B_ROUNDS=$ROUNDS B_CONNS=$CONNS \
  B_BATCHES=$BATCHES B_GROUPS="${groups%; }" python3 - "$RAW" >"$OUT" <<'PY'
import os, statistics, sys
e = os.environ
rows = {}
for line in open(sys.argv[1]):
    rnd, n, name, us = line.split('\t')
    rows.setdefault((int(n), name), {})[int(rnd)] = int(us)
shapes = [('bare', 'the log without triggers (the floor)'),
          ('triggers', "the rollups' triggers as `migrate` writes them: a merged insert today"),
          ('upserts', 'gated triggers + one multi-row upsert per rollup of the batch\'s groups (deltas aggregated in the proxy)'),
          ('reselect', 'gated triggers + INSERT … SELECT … GROUP BY over the batch\'s id range'),
          ('deltas', 'triggers appending to a pending-delta table (ingest only)'),
          ('fold', 'folding those deltas into the rollups, 500 per transaction'),
          ('deltas+fold', 'pending-delta table, ingest and fold')]
print("# Rollup upkeep: the server's CPU per log row, by merged-write shape\n")
print(f"- date: {e['B_DATE']}; heatsink {e['B_COMMIT']} (`migrate` only); MariaDB {e['B_VERSION']}")
print(f"- load average (1/5/15 min) at the start / end: {e['B_LOAD']}")
print(f"- {e['B_ROUNDS']} rounds; {e['B_CONNS']} connections (the merge lanes) each sending {e['B_BATCHES']} merged writes at once over the server's socket; "
      "the log and two rollups of bench-sysbench.sh (hour and day per track and country, 8 slots), half of the plays on one track")
print(f"- groups per batch and rollup (what aggregating a batch can save): {e['B_GROUPS']}")
print("- figure: mariadbd CPU time over the leg (/proc/PID/stat) / log rows inserted, µs; median over rounds (per round); ratio against `triggers` in the same round\n")
for n in sorted({k[0] for k in rows}):
    if (n, 'deltas') in rows and (n, 'fold') in rows:
        rows[(n, 'deltas+fold')] = {r: rows[(n, 'deltas')][r] + rows[(n, 'fold')].get(r, 0) for r in rows[(n, 'deltas')]}
    print(f"## {n} rows per merged write\n")
    print("| shape | µs per log row | per round | / triggers |")
    print("|---|---:|---|---:|")
    for key, label in shapes:
        v = rows.get((n, key))
        if not v:
            continue
        t = rows[(n, 'triggers')]
        ratio = statistics.median(v[r] / t[r] for r in v if t.get(r))
        print(f"| {label} | **{statistics.median(v.values()):.0f}** | {', '.join(str(v[r]) for r in sorted(v))} | {ratio:.2f} |")
    print()
PY
hs_log "wrote $OUT"
