#!/usr/bin/env bash
# What a merged ring append costs the server per row, by who numbers the rows. The
# ring of bench-sysbench.sh (`log` by `uid`, 5 rows per key, created by `heatsink
# migrate`), half of the appends on 10 hot keys and half on 990 others; one
# connection sends BATCHES merged writes of ROWS rows (a ring has one merged write in
# flight; about 27 rows per write is what 64 sysbench threads make), straight to the
# server over its socket. The figure is the server's CPU time (/proc/PID/stat) over
# the leg divided by the rows. Shapes:
#
#   trigger   the merged upsert as heatsink sends it today: the ring table's BEFORE
#             INSERT trigger takes each row's number from the sequence table
#   gated     the proxy numbers the rows: per batch, in one transaction, one
#             multi-row upsert of the sequence rows (`seq = seq + n`, RETURNING the
#             new values) and the ring upsert with seq and slot written in; the
#             trigger stays (rows written without numbers still need it) and skips
#             numbered rows
#   untriggered  the same two statements with no trigger at all: what numbering in
#             the proxy could save at most
#
#   scripts/bench-ring-upkeep.sh          # about 2 minutes
#
# Environment: ROUNDS (3), BATCHES (3000), ROWS (27), SKIP_BUILD=1, HEATSINK_BIN,
# OUT (bench/results/ring-upkeep.md).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/mariadb.sh
source "$SCRIPT_DIR/lib/mariadb.sh"
# shellcheck source=lib/merge_workloads.sh
source "$SCRIPT_DIR/lib/merge_workloads.sh"
hs_install_traps

ROUNDS=${ROUNDS:-3}
BATCHES=${BATCHES:-3000}
ROWS=${ROWS:-27}
OUT=${OUT:-$HS_REPO_DIR/bench/results/ring-upkeep.md}
HEATSINK_BIN=${HEATSINK_BIN:-$HS_REPO_DIR/target/release/heatsink}
if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$HS_REPO_DIR" && cargo build --release --quiet)
fi

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M')
mariadb_start
hs_tmpdir_into WORK ring-upkeep
merge_workloads_schema "$SB_DB"
merge_workloads_migrate ring "$WORK" "$HEATSINK_BIN"
BODY=$(mariadb_root -N -r "$SB_DB" -e "SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS
  WHERE TRIGGER_SCHEMA = '$SB_DB' AND TRIGGER_NAME = 'log_ring_hs_seq'")
[[ $BODY == BEGIN*END ]] || hs_die "unexpected numbering trigger: $BODY"

# set_trigger MODE: migrated | gated | none
set_trigger() {
  local body=${BODY#BEGIN }
  mariadb_root "$SB_DB" -e "DROP TRIGGER IF EXISTS log_ring_hs_seq"
  case $1 in
    none) return ;;
    migrated) body=$BODY ;;
    gated) body="BEGIN IF NEW.seq IS NULL THEN ${body% END} END IF; END" ;;
  esac
  printf 'delimiter //\nCREATE TRIGGER log_ring_hs_seq BEFORE INSERT ON log_ring FOR EACH ROW %s//\n' "$body" |
    mariadb_root "$SB_DB"
}

# The merged writes (seeded: every round sends the same rows). The numbers the
# proxy would write in are known here: one writer, sequences from an empty table.
python3 - "$WORK" "$BATCHES" "$ROWS" <<'PY'
import random, sys
work, batches, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cols = 'INSERT INTO log_ring (uid, visitor_uid, last_update, slot, seq) VALUES '
guards = ("ON DUPLICATE KEY UPDATE `id` = LAST_INSERT_ID(IF(VALUES(`seq`) > `seq`, VALUES(`id`), `id`)), "
          "`visitor_uid` = IF(VALUES(`seq`) > `seq`, VALUES(`visitor_uid`), `visitor_uid`), "
          "`last_update` = IF(VALUES(`seq`) > `seq`, VALUES(`last_update`), `last_update`), "
          "`seq` = IF(VALUES(`seq`) > `seq`, VALUES(`seq`), `seq`) RETURNING id")
rnd = random.Random(1)
seq = {}
with open(f'{work}/trigger.sql', 'w') as trig, open(f'{work}/numbered.sql', 'w') as numbered:
    for _ in range(batches):
        batch = sorted((rnd.randint(1, 10) if rnd.random() < 0.5 else rnd.randint(11, 1000),
                        rnd.randint(1, 10**6)) for _ in range(rows))
        trig.write(cols + ', '.join(f'({k}, {v}, NOW(6), NULL, NULL)' for k, v in batch) + f' {guards};\n')
        counts = {}
        for k, _ in batch:
            counts[k] = counts.get(k, 0) + 1
        tuples = []
        for k, v in batch:
            seq[k] = seq.get(k, 0) + 1
            tuples.append(f'({k}, {v}, NOW(6), {seq[k] % 5}, {seq[k]})')
        numbered.write('BEGIN; INSERT INTO log_seq (uid, seq) VALUES '
                       + ', '.join(f'({k}, {n})' for k, n in sorted(counts.items()))
                       + ' ON DUPLICATE KEY UPDATE seq = seq + VALUES(seq) RETURNING uid, seq;\n'
                       + cols + ', '.join(tuples) + f' {guards}; COMMIT;\n')
PY

RAW=$WORK/raw.tsv
: >"$RAW"
# leg ROUND NAME FILE TRIGGER -> server µs per row into $RAW, after checking that
# every ring row holds its key's latest numbers
leg() {
  local round=$1 name=$2 s0 s1 bad
  set_trigger "$4"
  mariadb_root "$SB_DB" -e "TRUNCATE log_ring; TRUNCATE log_seq"
  s0=$(hs_cpu_us "$MARIADB_PID")
  mariadb_root "$SB_DB" <"$WORK/$3.sql" >/dev/null || hs_die "leg $name failed"
  s1=$(hs_cpu_us "$MARIADB_PID")
  bad=$(mariadb_root -N "$SB_DB" -e "SELECT COUNT(*) FROM log_ring r JOIN log_seq s USING (uid)
    WHERE r.seq + 5 <= s.seq OR r.seq > s.seq OR r.slot <> r.seq % 5")
  [[ $bad == 0 ]] || hs_die "leg $name: $bad ring rows out of place"
  printf '%s\t%s\t%s\n' "$round" "$name" "$(((s1 - s0) / (BATCHES * ROWS)))" >>"$RAW"
}

for ((round = 1; round <= ROUNDS; round++)); do
  leg "$round" trigger trigger migrated
  leg "$round" gated numbered gated
  leg "$round" untriggered numbered none
  hs_log "round $round: $(awk -F'\t' -v r="$round" '$1 == r { printf "%s %s µs  ", $2, $3 }' "$RAW")"
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

B_DATE="$started–$(date -u +%H:%M) UTC" B_COMMIT=$(git -C "$HS_REPO_DIR" rev-parse --short HEAD) \
  B_VERSION=$MARIADB_VERSION B_LOAD="$load_start / $load_end" B_ROUNDS=$ROUNDS \
  B_BATCHES=$BATCHES B_ROWS=$ROWS python3 - "$RAW" >"$OUT" <<'PY'
import os, statistics, sys
e = os.environ
rows = {}
for line in open(sys.argv[1]):
    rnd, name, us = line.split('\t')
    rows.setdefault(name, {})[int(rnd)] = int(us)
shapes = [('trigger', "the ring table's trigger numbers each row: a merged append today"),
          ('gated', 'the proxy numbers the rows (sequence upsert with RETURNING, then the ring upsert, one transaction); the trigger skips numbered rows'),
          ('untriggered', 'the same two statements, no trigger at all (the most numbering in the proxy could save)')]
print("# Ring upkeep: the server's CPU per appended row, by who numbers the rows\n")
print(f"- date: {e['B_DATE']}; heatsink {e['B_COMMIT']} (`migrate` only); MariaDB {e['B_VERSION']}")
print(f"- load average (1/5/15 min) at the start / end: {e['B_LOAD']}")
print(f"- {e['B_ROUNDS']} rounds; one connection (a ring has one merged write in flight) sending {e['B_BATCHES']} merged writes of "
      f"{e['B_ROWS']} rows over the server's socket; the ring of bench-sysbench.sh (5 rows per key), half of the rows on 10 hot keys; "
      "every leg checked afterwards: each ring row holds one of its key's 5 latest numbers, in its slot")
print("- figure: mariadbd CPU time over the leg (/proc/PID/stat) / rows appended, µs; median over rounds (per round); ratio against `trigger` in the same round\n")
print("| shape | µs per row | per round | / trigger |")
print("|---|---:|---|---:|")
t = rows['trigger']
for key, label in shapes:
    v = rows[key]
    ratio = statistics.median(v[r] / t[r] for r in v if t.get(r))
    print(f"| {label} | **{statistics.median(v.values()):.0f}** | {', '.join(str(v[r]) for r in sorted(v))} | {ratio:.2f} |")
PY
hs_log "wrote $OUT"
