#!/usr/bin/env python3
"""Joins `fdpp bench-attention --json` outputs with attention_peers.py's into issue 13's table.

usage: attention_table.py OURS.json [...] --peers PEERS.json [...] [--core CORE.json [...]]
                          [--extra NAME=A.json,B.json ...]
Prints, per (heads, batch, context): async and sync time and % of 4.46 TB/s, cuDNN and flash
SDPA times and cuDNN's % of 4.46 TB/s, async's speed-up over cuDNN (and over FlashInfer where the
peers' files hold flashinfer_decode.py's rows), optionally async with the
CUDA-core loop forced (FDPP_DECODE_PATH=core, --core files), optionally any other variants of ours
(--extra NAME=FILES, e.g. w4=attn_warps4_32.json,attn_warps4_8.json from bench-attention
--decode-warps 4): one column per mode the files hold, "NAME async us" and "NAME sync us", and issue
13's verdicts (on the main files only):
  never slower than cuDNN; >= 1.1x where cuDNN is below 85% of the bandwidth; >= 92% of 4.46 TB/s
  where batch x context >= 16K; async at least as fast as sync.
A last line counts each goal's misses (async against sync also by more than 1%: identical kernels
vary by about that much between runs). With --extra, a second table gives per (heads, context) the
geomean over batch and mode of each variant's time over ours ("ours over NAME": above 1, ours is
faster), the summary an A/B of two builds needs.
"""
import argparse
import json
import math

DESIGN_BW = 4.46e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours", nargs="+")
    ap.add_argument("--peers", nargs="*", default=[])
    ap.add_argument("--core", nargs="*", default=[])
    ap.add_argument("--extra", action="append", default=[], help="NAME=FILE[,FILE...]")
    a = ap.parse_args()
    ours, peers, core = {}, {}, {}
    extras = []  # (name, {key: row}, modes present)
    # Rows are keyed without the head dim, so files of several would overwrite each other's points:
    # every row's head dim is collected as it is read, and a mix is refused below.
    dims = set()

    def results(path, field="results"):
        rows = json.load(open(path))[field]
        dims.update(r.get("head_dim", 128) for r in rows)
        return rows

    for spec in a.extra:
        name, _, files = spec.partition("=")
        if not name or not files:
            ap.error(f"--extra '{spec}' is not NAME=FILE[,FILE...]")
        rows = {}
        for f in files.split(","):
            for r in results(f):
                rows[(r["heads"], r["kv_heads"], r["batch"], r["context"], r["mode"])] = r
        modes = [m for m in ("async", "sync") if any(k[4] == m for k in rows)]
        extras.append((name, rows, modes))
    extra_cols = [(name, rows, m) for name, rows, modes in extras for m in modes]
    for files, into in ((a.ours, ours), (a.core, core)):
        for f in files:
            for r in results(f):
                into[(r["heads"], r["kv_heads"], r["batch"], r["context"], r["mode"])] = r
    for f in a.peers:
        for r in results(f, "rows"):
            if "us" in r:
                peers[(r["heads"], r["kv_heads"], r["B"], r["L"], r["peer"])] = r
    if len(dims) > 1:
        ap.error(f"the files hold head dims {sorted(dims)}: give one head dim's files per table")
    keys = sorted({k[:4] for k in ours})
    has_fi = any(k[4] == "flashinfer" for k in peers)
    misses = {"never slower than cuDNN": 0, ">=1.1x where cuDNN <85% BW": 0, ">=92% BW": 0, "async >= sync": 0}
    checked = dict.fromkeys(misses, 0)
    async_over_1pct = 0
    fi_compared = fi_slower = 0  # points with FlashInfer, and those where async is slower than it
    print("| heads q/kv | B | L | async us | async % BW | sync us | sync % BW | cuDNN us | cuDNN % BW | flash us | "
          "async vs cuDNN |" + (" FlashInfer us | async vs FlashInfer |" if has_fi else "") + (" async, CUDA cores us |" if core else "") +
          "".join(f" {n} {m} us |" for n, _, m in extra_cols) + " goals missed |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if has_fi else "") +
          (" ---: |" if core else "") + " ---: |" * len(extra_cols) + " --- |")
    for k in keys:
        h, kvh, b, L = k
        an, sy = ours.get(k + ("async",)), ours.get(k + ("sync",))
        cu, fl = peers.get(k + ("sdpa-cudnn",)), peers.get(k + ("sdpa-flash",))
        fi = peers.get(k + ("flashinfer",))
        co = core.get(k + ("async",))
        if fi and an:
            fi_compared += 1
            fi_slower += an["us"] > fi["us"]
        speed = cu["us"] / an["us"] if an and cu else None
        cu_bw = an["pct_design_bw"] * an["us"] / cu["us"] if an and cu else None  # same bytes, cuDNN's time
        missed = []

        def goal(name, ok):
            checked[name] += 1
            if not ok:
                misses[name] += 1
                missed.append(name)

        if speed is not None:
            goal("never slower than cuDNN", speed >= 1.0)
            if cu_bw < 0.85:
                goal(">=1.1x where cuDNN <85% BW", speed >= 1.1)
        if an and b * L >= 16384:
            goal(">=92% BW", an["pct_design_bw"] >= 0.92)
        if an and sy:
            goal("async >= sync", an["us"] <= sy["us"])
            async_over_1pct += an["us"] > 1.01 * sy["us"]
        f = lambda r, key, fmt: (fmt.format(r[key] * (100 if key.startswith("pct") else 1)) if r else "-")
        print(f"| {h}/{kvh} | {b} | {L} | {f(an, 'us', '{:.2f}')} | {f(an, 'pct_design_bw', '{:.1f}')} | "
              f"{f(sy, 'us', '{:.2f}')} | {f(sy, 'pct_design_bw', '{:.1f}')} | {f(cu, 'us', '{:.2f}')} | "
              f"{'%.1f' % (100 * cu_bw) if cu_bw else '-'} | {f(fl, 'us', '{:.2f}')} | "
              f"{'%.2fx' % speed if speed else '-'} |" +
              (f" {f(fi, 'us', '{:.2f}')} | {'%.2fx' % (fi['us'] / an['us']) if fi and an else '-'} |" if has_fi else "") +
              (f" {f(co, 'us', '{:.2f}')} |" if core else "") +
              "".join(f" {f(rows.get(k + (m,)), 'us', '{:.2f}')} |" for _, rows, m in extra_cols) +
              f" {'; '.join(missed) if missed else '-'} |")
    print()
    print("goals: " + "; ".join(f"{n}: missed at {misses[n]} of {checked[n]} points" for n in misses) +
          f" ({async_over_1pct} by more than 1%)")
    if fi_compared:
        print(f"async slower than FlashInfer at {fi_slower} of {fi_compared} points")
    if extras:
        print_speedups(ours, extras)


def print_speedups(ours, extras):
    """Per (heads, context): geomean over batch and mode of each variant's time / ours."""
    print()
    print("| heads q/kv | context |" + "".join(f" ours over {name} |" for name, _, _ in extras))
    print("| --- | ---: |" + " ---: |" * len(extras))
    for h, kvh, L in sorted({(k[0], k[1], k[3]) for k in ours}):
        cells = []
        for _, rows, _ in extras:
            logs = [math.log(rows[k]["us"] / r["us"]) for k, r in ours.items()
                    if (k[0], k[1], k[3]) == (h, kvh, L) and k in rows]
            cells.append(f"{math.exp(sum(logs) / len(logs)):.3f}" if logs else "-")
        print(f"| {h}/{kvh} | {L} |" + "".join(f" {c} |" for c in cells))


if __name__ == "__main__":
    main()
