#!/usr/bin/env python3
"""FlashInfer's paged decode attention (BatchDecodeWithPagedKVCacheWrapper) on the shapes of
`fdpp bench-attention`, in the same GPU run as fdpp's, timed as attention_peers.py times torch SDPA
(one CUDA graph of calls over several K/V copies whose total exceeds twice the L2, median replay).

FlashInfer compiles its kernels with nvcc at first use (JIT), or loads them ahead-of-time compiled
(scripts/flashinfer-pack.sh builds them on the development machine). The GPU machine has no
internet: the package travels with the call (scripts/gpu-check.sh's flashinfer stage); a failure to
install, import or compile is recorded, not fatal.

Pages are in random order by default, as `fdpp bench-attention` shuffles its blocks (a paged cache
that has served a while). FlashInfer has two decode kernels, CUDA cores and tensor cores (its
prefill kernel, which it advises for groups of 4 or more query heads): where the group is larger
than one both are timed and the faster is the row's "us" ("kernel" says which).

usage: flashinfer_decode.py --heads 32 --kv-heads 8 [--head-dim 128] [-b 1,8] [-c 1024,16384]
                            [--page-order shuffled|sequential] [--json OUT]
"""
import argparse
import json
import math
import sys

import torch

from peers import graph_time_us  # same directory

L2 = 60e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("-b", "--batch", default="1,8,32")
    ap.add_argument("-c", "--context", default="1024,4096,16384")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--page-order", choices=("shuffled", "sequential"), default="shuffled")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    try:
        import flashinfer
        version = getattr(flashinfer, "__version__", "?")
    except Exception as e:  # not installed, or its imports fail on this machine
        rows.append({"peer": "flashinfer", "error": f"import: {type(e).__name__}: {str(e).splitlines()[0][:200]}"})
        print(rows[-1]["error"], flush=True)
        version = None
    h, kvh, d, ps = a.heads, a.kv_heads, a.head_dim, a.page_size
    if version is not None:
        workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        gen = torch.Generator().manual_seed(5)
        for b in (int(x) for x in a.batch.split(",")):
            for L in (int(x) for x in a.context.split(",")):
                pages = math.ceil(L / ps)
                kv_bytes = 2 * b * L * kvh * d * 2
                copies = max(1, min(64, math.ceil(2 * L2 / kv_bytes)))
                kernels = {"cuda cores": False} if h == kvh else {"tensor cores": True, "cuda cores": False}
                times = {}
                try:
                    caches = [torch.empty(b * pages, 2, ps, kvh, d, device="cuda", dtype=torch.float16).uniform_(-1, 1)
                              for _ in range(copies)]
                    q = torch.empty(b, h, d, device="cuda", dtype=torch.float16).uniform_(-1, 1)
                    indptr = torch.arange(0, b + 1, device="cuda", dtype=torch.int32) * pages
                    indices = (torch.randperm(b * pages, generator=gen) if a.page_order == "shuffled"
                               else torch.arange(b * pages)).to(device="cuda", dtype=torch.int32)
                    last = torch.full((b,), L - (pages - 1) * ps, device="cuda", dtype=torch.int32)
                    for name, tensor_cores in kernels.items():
                        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
                        w.plan(indptr, indices, last, h, kvh, d, ps, pos_encoding_mode="NONE", data_type=torch.float16)
                        fns = [lambda c=c: w.run(q, c) for c in caches]
                        times[name] = graph_time_us(lambda: [f() for f in fns]) / len(fns)
                except Exception as e:
                    rows.append({"peer": "flashinfer", "heads": h, "kv_heads": kvh, "B": b, "L": L,
                                 "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"})
                    print(f"flashinfer {h}/{kvh} B {b} L {L}: {rows[-1]['error']}", flush=True)
                    continue
                kernel = min(times, key=times.get)
                us = times[kernel]
                rows.append({"peer": "flashinfer", "version": version, "heads": h, "kv_heads": kvh, "head_dim": d,
                             "B": b, "L": L, "us": us, "pct_design_bw": kv_bytes / (us * 1e-6) / 4.46e12,
                             "kernel": kernel, "page_order": a.page_order,
                             **{f"us {name}": t for name, t in times.items()}})
                print(f"flashinfer {version} {h}/{kvh} D {d} B {b} L {L}: "
                      + ", ".join(f"{name} {t:.2f}" for name, t in times.items()) + f"; {us:.2f} us", flush=True)
                del caches
                torch.cuda.empty_cache()
    if a.json:
        json.dump({"rows": rows}, open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
