#!/usr/bin/env python3
"""The split-KV plan against a sweep of split counts: how much slower the planned count is than the
best one measured, per point and on average (what a re-fit of plan_decode_splits starts from).

usage: split_plan_table.py SWEEP.json [...] [--above 1.02] [--all]
SWEEP.json: `fdpp bench-attention ... --splits 0,1,2,4,8,... --json` (0 times the plan; every row
records the count it ran and the count the plan takes). Per (head dim, heads, batch, context, mode):
the plan's count and time (the fastest row that ran the planned count), the fastest count and its
time, and their ratio ("regret"). Prints the points whose regret exceeds --above (every point with
--all), then one line per head dim and mode: the geometric mean and the largest regret over its
points, and how many exceed --above.
"""
import argparse
import json
import math


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--above", type=float, default=1.02, help="list the points whose regret exceeds this")
    ap.add_argument("--all", action="store_true", help="list every point")
    a = ap.parse_args()
    points = {}  # (head_dim, heads, kv_heads, batch, context, mode) -> rows
    for f in a.sweeps:
        with open(f) as fh:
            for r in json.load(fh)["results"]:
                key = (r.get("head_dim", 128), r["heads"], r["kv_heads"], r["batch"], r["context"], r["mode"])
                points.setdefault(key, []).append(r)
    print("| D | heads q/kv | B | L | mode | plan: splits, us | best: splits, us | regret |")
    print("| ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |")
    regrets = {}  # (head_dim, mode) -> [regret]
    for key in sorted(points):
        rows = points[key]
        planned = rows[0]["planned_splits"]
        at_plan = [r["us"] for r in rows if r["splits"] == planned]
        if not at_plan:
            continue  # the sweep did not run the planned count (no 0 in --splits)
        plan_us = min(at_plan)
        best = min(rows, key=lambda r: r["us"])
        regret = plan_us / best["us"]
        regrets.setdefault((key[0], key[5]), []).append(regret)
        if a.all or regret > a.above:
            d, h, kvh, b, ctx, mode = key
            print(f"| {d} | {h}/{kvh} | {b} | {ctx} | {mode} | {planned}, {plan_us:.2f} | {best['splits']}, "
                  f"{best['us']:.2f} | {regret:.3f} |")
    for (d, mode), rs in sorted(regrets.items()):
        geo = math.exp(sum(math.log(r) for r in rs) / len(rs))
        over = sum(r > a.above for r in rs)
        print(f"head_dim {d} {mode}: plan over best, geomean {geo:.4f}, max {max(rs):.3f}, above {a.above} at {over} of "
              f"{len(rs)} points")


if __name__ == "__main__":
    main()
