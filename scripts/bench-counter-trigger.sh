#!/usr/bin/env bash
# What the counter's slot trigger costs the server when a slot row is first made (the
# only time it fires), in each form it has had, as `heatsink migrate` writes them:
#   ignore    the first form, `INSERT IGNORE` of the key's row (by hand: migrate now
#             replaces it)
#   handler   `INSERT` of the key's row in a 1062 handler: the form for tables whose
#             other unique keys cannot hold a new key's row
#   checked   the same, and after a duplicate a locking read of the key's row: the form
#             for tables with such a key (here `tag NOT NULL DEFAULT (UUID()) UNIQUE`)
# Each form gets its own database with KEYS existing keys; the slot upserts are sent
# straight to the server, one statement at a time by the mariadb client: SLOTS new slot
# rows for every existing key (the trigger finds the key's row), then one for each of
# KEYS new keys (the trigger creates it). The figure is mariadbd's CPU time over a leg
# (/proc/PID/stat) divided by its statements; ROUNDS rounds, forms in turn, medians.
# Writes bench/results/counter-trigger.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-20000}
SLOTS=${SLOTS:-3}
OUT=${OUT:-bench/results/counter-trigger.md}
FORMS=(ignore handler checked)

cargo build --release --quiet --bin heatsink
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
started=$(date -u '+%Y-%m-%d %H:%M')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
mariadb_start
hs_tmpdir_into WORK trigger

python3 - "$WORK" "$KEYS" "$SLOTS" <<'PY'
import sys
work, keys, slots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
upsert = "INSERT INTO hits_slots (slug, slot, cnt) VALUES ('{}', {}, 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1;\n"
with open(f'{work}/existing.sql', 'w') as f:
    for s in range(1, slots + 1):
        for k in range(keys):
            f.write(upsert.format(f'k{k}', s))
with open(f'{work}/new.sql', 'w') as f:
    for k in range(keys):
        f.write(upsert.format(f'n{k}', 0))
PY

# fresh FORM: its database, KEYS keys, its slot table and trigger.
fresh() {
  local db=tr_$1 extra="" rules
  # A unique key with a default that is not NULL: migrate cannot tell that its values
  # differ, and writes the checked form.
  [[ $1 != checked ]] || extra=", tag VARCHAR(36) NOT NULL DEFAULT (UUID()), UNIQUE KEY u_tag (tag)"
  mariadb_root -e "DROP DATABASE IF EXISTS $db; CREATE DATABASE $db; GRANT ALL ON $db.* TO '$SB_USER'@'%';
    CREATE TABLE $db.hits (slug VARCHAR(64) NOT NULL PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0,
      note VARCHAR(20)$extra) ENGINE=InnoDB;
    INSERT INTO $db.hits (slug, cnt) SELECT CONCAT('k', seq), 0 FROM $db.seq_0_to_$((KEYS - 1))"
  hs_tmpdir_into rules "rules-$1"
  printf '[[counter]]\nname = "hits"\ntable = "hits"\nkey = ["slug"]\ncolumns = ["cnt"]\nslots = 16\nslot_table = "hits_slots"\n' \
    >"$rules/counter.toml"
  target/release/heatsink migrate --rules "$rules" \
    --backend-url "mysql://$SB_USER:$SB_PASSWORD@127.0.0.1:$MARIADB_PORT/$db" --apply >"$WORK/migrate-$1.log" 2>&1 ||
    { cat "$WORK/migrate-$1.log" >&2; hs_die "heatsink migrate failed"; }
  if [[ $1 == ignore ]]; then
    mariadb_root "$db" -e "CREATE OR REPLACE TRIGGER hits_slots_hs_ai AFTER INSERT ON hits_slots FOR EACH ROW
      INSERT IGNORE INTO $db.hits (slug, cnt) VALUES (NEW.slug, 0)"
  fi
  mariadb_root -N -e "SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS
    WHERE TRIGGER_SCHEMA = '$db' AND TRIGGER_NAME = 'hits_slots_hs_ai'" >"$WORK/body-$1.txt"
}

RAW=$WORK/raw.tsv
: >"$RAW"
for ((round = 1; round <= ROUNDS; round++)); do
  for form in "${FORMS[@]}"; do
    fresh "$form"
    for leg in existing new; do
      n=$KEYS
      [[ $leg != existing ]] || n=$((KEYS * SLOTS))
      s0=$(hs_cpu_us "$MARIADB_PID")
      mariadb_root "tr_$form" <"$WORK/$leg.sql"
      s1=$(hs_cpu_us "$MARIADB_PID")
      printf '%s\t%s\t%s\t%s\n' "$round" "$form" "$leg" "$(((s1 - s0) / n))" >>"$RAW"
    done
    missing=$(mariadb_root -N "tr_$form" -e "SELECT COUNT(*) FROM hits_slots s LEFT JOIN hits h USING (slug) WHERE h.slug IS NULL")
    [[ $missing == 0 ]] || hs_die "$form: $missing slot rows without a row of their key"
  done
  hs_log "round $round: $(awk -F'\t' -v r="$round" '$1 == r { printf "%s/%s %s µs  ", $2, $3, $4 }' "$RAW")"
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

B_DATE="$started–$(date -u +%H:%M) UTC" B_COMMIT=$(git rev-parse --short HEAD) B_VERSION=$MARIADB_VERSION \
  B_LOAD="$load_start / $load_end" B_ROUNDS=$ROUNDS B_KEYS=$KEYS B_SLOTS=$SLOTS \
  python3 - "$RAW" "$WORK" >"$OUT" <<'PY'
import os, statistics, sys
e = os.environ
raw, work = sys.argv[1], sys.argv[2]
v = {}
for line in open(raw):
    r, form, leg, us = line.split('\t')
    v.setdefault((form, leg), {})[int(r)] = int(us)
forms = [('ignore', 'the first form: `INSERT IGNORE` (replaced by migrate)'),
         ('handler', 'a 1062 handler around the insert (tables no other unique key of which can hold the row)'),
         ('checked', 'the handler and a locking read of the key\'s row after a duplicate (tables with such a key)')]
print("# The counter's slot trigger: the server's CPU per new slot row\n")
print(f"- date: {e['B_DATE']}; heatsink {e['B_COMMIT']} (`migrate` only); MariaDB {e['B_VERSION']}")
print(f"- load average (1/5/15 min) at the start / end: {e['B_LOAD']}")
print(f"- {e['B_ROUNDS']} rounds, the forms in turn; {e['B_KEYS']} existing keys per form; slot upserts sent straight to the server one at a time by the `mariadb` client: "
      f"{e['B_SLOTS']} new slot rows per existing key, then one for each of {e['B_KEYS']} new keys")
print("- figure: mariadbd CPU time over the leg (/proc/PID/stat) / statements, µs; median over rounds (per round), and the ratio to the first form in the same round")
print("- after every leg: no slot row without a row of its key\n")
print("| trigger | existing key, new slot row | per round | / first form | new key | per round | / first form |")
print("|---|---:|---|---:|---:|---|---:|")
for form, label in forms:
    cells = []
    for leg in ('existing', 'new'):
        x, base = v[(form, leg)], v[('ignore', leg)]
        ratio = statistics.median(x[r] / base[r] for r in x if base.get(r))
        cells += [f"**{statistics.median(x.values()):.0f}**", ', '.join(str(x[r]) for r in sorted(x)), f"{ratio:.2f}"]
    print(f"| {label} | " + ' | '.join(cells) + ' |')
print("\nThe trigger bodies as the server holds them:\n")
for form, _ in forms:
    body = open(f'{work}/body-{form}.txt').read().strip()
    print(f"- {form}: `{body}`")
PY
hs_log "wrote $OUT"
