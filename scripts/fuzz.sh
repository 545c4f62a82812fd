#!/usr/bin/env bash
# Long differential fuzz run (tests/fuzz.rs): many seeds, a release build. Every seed
# runs the counter and ring kinds on fresh databases through heatsink and on plain
# reference tables, comparing every answer and the logical state; then SESSION_ROUNDS
# (default 20) rounds of 16 concurrent sessions with state prefixes per kind
# (counter, ring, rollup logs), compared with the same sessions sent directly.
#
#   scripts/fuzz.sh                 # seeds 1..50, 5000 statements per kind and seed
#   SEEDS="7 8 9" STATEMENTS=20000 scripts/fuzz.sh
#   FIRST=100 COUNT=1000 scripts/fuzz.sh
#
# Shapes of differences that were fixed always run. Shapes of known open differences
# (HEATSINK_FUZZ_ALL=1), of differences the fuzzer found and nobody fixed yet
# (HEATSINK_FUZZ_FOUND=1) and of documented limitations (HEATSINK_FUZZ_DOCUMENTED=1)
# stay off unless set; HEATSINK_FUZZ_TAGS=a,b picks single ones. A failing seed's output is kept in target/fuzz/seed-<n>.log; it names the
# statement and how to replay it (HEATSINK_FUZZ_SEED, HEATSINK_FUZZ_STATEMENTS).
# Exits 1 when any seed failed.
set -euo pipefail
cd "$(dirname "$0")/.."
STATEMENTS=${STATEMENTS:-5000}
FIRST=${FIRST:-1}
COUNT=${COUNT:-50}
SEEDS=${SEEDS:-$(seq "$FIRST" $((FIRST + COUNT - 1)))}
logs=target/fuzz
mkdir -p "$logs"

cargo test --release --test fuzz --test fuzz_rollup --no-run --quiet
failed=()
for seed in $SEEDS; do
  log="$logs/seed-$seed.log"
  start=$(date +%s)
  if HEATSINK_FUZZ_SEED=$seed HEATSINK_FUZZ_STATEMENTS=$STATEMENTS HEATSINK_FUZZ_ROUNDS=1 \
      cargo test --release --quiet --test fuzz _matches_a_plain_table -- --nocapture >"$log" 2>&1 \
    && HEATSINK_FUZZ_SEED=$seed HEATSINK_FUZZ_ROUNDS=${SESSION_ROUNDS:-20} \
      cargo test --release --quiet --test fuzz --test fuzz_rollup _sessions_match_direct -- --nocapture >>"$log" 2>&1; then
    echo "seed $seed: ok ($(( $(date +%s) - start )) s)"
    rm -f "$log"
  else
    echo "seed $seed: FAILED, see $log"
    grep -a -m 3 -E '^(statement|logical state|session statement|connection failed)' "$log" | cut -c1-200 || true
    failed+=("$seed")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed seeds: ${failed[*]}"
  exit 1
fi
echo "all seeds passed"
