"""Percentiles from sysbench's latency histogram (`--histogram=on`).

    python3 sysbench_histogram.py LOG P [P ...]  -> one value per P, in ms

The histogram's rows are `value |*** count` (milliseconds, log-spaced buckets);
a percentile is the value of the bucket where the cumulative count reaches it.
Prints `nan` when the log has no histogram (no events).
"""
import re
import sys

ROW = re.compile(r"^\s*([0-9.]+)\s*\|\**\s+([0-9]+)\s*$")


def main():
    log, ps = sys.argv[1], [float(p) for p in sys.argv[2:]]
    rows, inside = [], False
    for line in open(log, errors="replace"):
        if line.startswith("Latency histogram"):
            inside = True
            continue
        if inside:
            m = ROW.match(line)
            if m:
                rows.append((float(m.group(1)), int(m.group(2))))
            elif rows:
                break
    total = sum(c for _, c in rows)
    out = []
    for p in ps:
        if total == 0:
            out.append("nan")
            continue
        want, seen = total * p / 100.0, 0
        for value, count in rows:
            seen += count
            if seen >= want:
                out.append(f"{value:.3f}")
                break
    print(" ".join(out))


if __name__ == "__main__":
    main()
