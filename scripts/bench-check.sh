#!/usr/bin/env bash
# `heatsink check` against rule files of growing size, before and after, in one run.
#
# Generates one rule file per size in SIZES (default "1000 5000 10000 20000"): that
# many rules (four counter rules to one ring rule, each on its own tables) and ten
# [[test]] cases (so the planner's engine is built too). Times `heatsink check
# --rules FILE` (no database) ROUNDS times (default 3, median) with
#   after:  this tree (release build in target/)
#   before: BASE_REF (default: the merge base of HEAD and main; the recorded run
#           compared with ac619a2, the last commit before check became linear), exported with
#           `git archive` and built in its own target dir (target/bench-check-base),
#           so the working tree is not touched; BASE_REF=none skips it.
# A run longer than TIMEOUT seconds (default 300) is stopped and reported as such.
# Writes bench/results/check.md with the times and the time per rule at each size
# relative to 1,000 rules (1.0 = linear).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-"1000 5000 10000 20000"}
ROUNDS=${ROUNDS:-3}
TIMEOUT=${TIMEOUT:-300}
OUT=bench/results/check.md
if [ -z "${BASE_REF:-}" ]; then
  BASE_REF=$(git merge-base HEAD main)
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/heatsink-bench-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "building this tree (release)" >&2
cargo build --release --quiet --bin heatsink
after_bin=target/release/heatsink
before_bin=""
if [ "$BASE_REF" != "none" ]; then
  echo "building $BASE_REF (release, target/bench-check-base)" >&2
  mkdir -p "$work/base"
  git archive "$BASE_REF" | tar -x -C "$work/base"
  if [ ! -d target/bench-check-base/release ]; then
    # Seed it with this tree's compiled dependencies, so that only heatsink itself is
    # built (its own artifacts are removed: their freshness would be judged against
    # this tree's sources).
    mkdir -p target/bench-check-base
    cp -a target/release target/bench-check-base/release
  fi
  rm -rf target/bench-check-base/release/.fingerprint/heatsink-* \
    target/bench-check-base/release/deps/heatsink-* \
    target/bench-check-base/release/deps/libheatsink-* \
    target/bench-check-base/release/heatsink target/bench-check-base/release/heatsink.d \
    target/bench-check-base/release/incremental/heatsink-*
  cargo build --release --quiet --bin heatsink \
    --manifest-path "$work/base/Cargo.toml" --target-dir target/bench-check-base
  before_bin=target/bench-check-base/release/heatsink
fi

gen() { # gen N FILE
  python3 - "$1" "$2" <<'EOF'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    for i in range(n):
        if i % 5 == 4:
            f.write(f'[[ring]]\nname = "r{i}"\ntable = "log{i}"\nkey = ["uid"]\nsize = 5\n'
                    f'ring_table = "log{i}_ring"\n\n')
        else:
            f.write(f'[[counter]]\nname = "r{i}"\ntable = "t{i}"\nkey = ["k"]\ncolumns = ["c"]\n'
                    f'slots = 4\nslot_table = "t{i}_slots"\n\n')
    for i in range(10):
        j = i + i // 4  # counter rules only (every fifth rule is a ring)
        f.write(f'[[test]]\nsql = "UPDATE t{j} SET c = c + 1 WHERE k = 1"\nexpect = "rewrite"\n\n')
EOF
}

# time_check BIN FILE: median seconds of ROUNDS runs, or "timeout".
time_check() {
  local bin=$1 file=$2 times=() start end
  for _ in $(seq "$ROUNDS"); do
    start=$(date +%s.%N)
    rc=0
    timeout "$TIMEOUT" "$bin" check --rules "$file" >"$work/out.txt" 2>&1 || rc=$?
    end=$(date +%s.%N)
    if [ "$rc" -eq 124 ]; then echo timeout; return; fi
    if [ "$rc" -ne 0 ]; then
      tail -5 "$work/out.txt" >&2
      echo "check failed on $file" >&2
      exit 1
    fi
    times+=("$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.4f", b - a}')")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

results="$work/results.tsv"
: >"$results"
for n in $SIZES; do
  gen "$n" "$work/rules-$n.toml"
  a=$(time_check "$after_bin" "$work/rules-$n.toml")
  b=skipped
  if [ -n "$before_bin" ]; then
    b=$(time_check "$before_bin" "$work/rules-$n.toml")
  fi
  echo "$n rules: after $a s, before $b s" >&2
  printf '%s\t%s\t%s\n' "$n" "$a" "$b" >>"$results"
done

python3 - "$results" "$BASE_REF" "$ROUNDS" "$TIMEOUT" >"$OUT" <<'EOF'
import sys, datetime
path, base, rounds, timeout = sys.argv[1:5]
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
def num(v):
    try:
        return float(v)
    except ValueError:
        return None
first = rows[0]
n0 = int(first[0])
print("# `heatsink check` time against the number of rules")
print()
print(f"Run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by `scripts/bench-check.sh` "
      f"(release builds, median of {rounds} runs, no database; before = `{base[:12]}`).")
print("Rule files: four counter rules to one ring rule, each on its own tables, plus ten")
print("`[[test]]` cases. *Per-rule ratio*: time per rule at that size divided by time per")
print(f"rule at {n0:,} rules (1.0 = linear, 10 = ten times the cost per rule).")
print()
print("| rules | after (s) | after per-rule ratio | before (s) | before per-rule ratio | before / after |")
print("|---:|---:|---:|---:|---:|---:|")
def per_rule(v, n, v0):
    if v is None or v0 is None or v0 == 0:
        return "–"
    return f"{(v / n) / (v0 / n0):.2f}"
for n, a, b in rows:
    n = int(n)
    av, bv = num(a), num(b)
    a_txt = f"{av:.3f}" if av is not None else a
    b_txt = f"{bv:.3f}" if bv is not None else (f"> {timeout}" if b == "timeout" else b)
    speed = f"{bv / av:.0f} ×" if av and bv else "–"
    print(f"| {n:,} | {a_txt} | {per_rule(av, n, num(first[1]))} | {b_txt} | "
          f"{per_rule(bv, n, num(first[2]))} | {speed} |")
EOF
cat "$OUT"
