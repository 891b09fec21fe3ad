#!/usr/bin/env python3
"""The GPU's busy fraction from an Nsight Systems trace (exported to SQLite): the union of kernel,
copy and memset intervals over the window from the first attention kernel (the first engine step;
loading and warm-up come before) to the last activity's end.

    nsys profile -t cuda --cuda-graph-trace=node -o run fdpp generate -f ...
    nsys export --type sqlite -o run.sqlite run.nsys-rep
    python3 bench/gpu_busy.py run.sqlite [--json OUT.json]

Standard library only. The idle time is also split into gaps by length: short gaps are launch and
dependency latency inside a step, long ones are the host between steps.
"""
import argparse
import json
import sqlite3
import sys


def intervals(db):
    out = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        try:
            out += db.execute(f"SELECT start, end FROM {table}").fetchall()
        except sqlite3.OperationalError:
            pass  # a trace without that kind of activity
    return sorted(out)


def first_step_start(db):
    row = db.execute(
        "SELECT MIN(k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON k.demangledName = s.id "
        "WHERE s.value LIKE '%attention%'").fetchone()
    return row[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sqlite")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    db = sqlite3.connect(args.sqlite)
    begin = first_step_start(db)
    if begin is None:
        sys.exit("gpu_busy: no attention kernel in the trace")
    spans = [(max(s, begin), e) for s, e in intervals(db) if e > begin]
    if not spans:
        sys.exit("gpu_busy: no activity after the first step")
    end = max(e for _, e in spans)
    busy, cur_s, cur_e = 0, None, None
    gaps = []
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
                gaps.append(s - cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    wall = end - begin
    bins = {"<10us": 0, "10-100us": 0, "0.1-1ms": 0, ">1ms": 0}
    for g in gaps:
        key = "<10us" if g < 1e4 else "10-100us" if g < 1e5 else "0.1-1ms" if g < 1e6 else ">1ms"
        bins[key] += g
    r = {"wall_s": wall / 1e9, "busy_s": busy / 1e9, "busy_fraction": busy / wall,
         "idle_s_by_gap": {k: v / 1e9 for k, v in bins.items()}}
    print(f"GPU busy {r['busy_s']:.2f} s of {r['wall_s']:.2f} s from the first step: {100 * r['busy_fraction']:.1f}%; "
          "idle by gap length: " + ", ".join(f"{k} {v:.3f} s" for k, v in r["idle_s_by_gap"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    main()
