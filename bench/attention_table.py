#!/usr/bin/env python3
"""Joins `fdpp bench-attention --json` outputs with attention_peers.py's into issue 5's table.

usage: attention_table.py OURS.json [OURS2.json ...] --peers PEERS.json [PEERS2.json ...]
Prints, per (heads, batch, context): async and sync time and % of 4.46 TB/s, cuDNN and flash
SDPA times, async's speed-up over cuDNN, and the goals' verdicts.
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours", nargs="+")
    ap.add_argument("--peers", nargs="*", default=[])
    a = ap.parse_args()
    ours, peers = {}, {}
    for f in a.ours:
        for r in json.load(open(f))["results"]:
            ours[(r["heads"], r["kv_heads"], r["batch"], r["context"], r["mode"])] = r
    for f in a.peers:
        for r in json.load(open(f))["rows"]:
            if "us" in r:
                peers[(r["heads"], r["kv_heads"], r["B"], r["L"], r["peer"])] = r
    keys = sorted({k[:4] for k in ours})
    print("| heads q/kv | B | L | async us | async % BW | sync us | sync % BW | cuDNN us | flash us | async vs cuDNN | goal |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for k in keys:
        h, kvh, b, L = k
        an, sy = ours.get(k + ("async",)), ours.get(k + ("sync",))
        cu, fl = peers.get(k + ("sdpa-cudnn",)), peers.get(k + ("sdpa-flash",))
        speed = cu["us"] / an["us"] if an and cu else None
        goals = []
        if an and b * L >= 16384:
            goals.append("BW>=88%: " + ("met" if an["pct_design_bw"] >= 0.88 else "MISSED"))
        if speed is not None:
            if b == 1 and L <= 4096:
                goals.append(">=1.3x cuDNN: " + ("met" if speed >= 1.3 else "MISSED"))
            goals.append("<=3% slower: " + ("met" if speed >= 1 / 1.03 else "MISSED"))
        f = lambda r, key, fmt: (fmt.format(r[key] * (100 if key.startswith("pct") else 1)) if r else "-")
        print(f"| {h}/{kvh} | {b} | {L} | {f(an, 'us', '{:.2f}')} | {f(an, 'pct_design_bw', '{:.1f}')} | "
              f"{f(sy, 'us', '{:.2f}')} | {f(sy, 'pct_design_bw', '{:.1f}')} | {f(cu, 'us', '{:.2f}')} | "
              f"{f(fl, 'us', '{:.2f}')} | {'%.2fx' % speed if speed else '-'} | {'; '.join(goals)} |")


if __name__ == "__main__":
    main()
